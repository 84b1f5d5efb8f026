"""The service's own alarm: the rules run on every ingested batch, and what they raise.

:mod:`.detectors` (the entry point, :func:`~.detectors.detect`; spike and outlier rules),
:mod:`.trends` (logit ceiling, sustained growth, loss and gradient-norm spikes), :mod:`.heads`
(per-head names), :mod:`.forecast_band` (a watched run leaving its forecast band),
:mod:`.explain` (what an incident says to a person), :mod:`.alertmanager` (Alertmanager's
notifications stored as alerts) and :mod:`.prometheus` (the ``/metrics`` exporter the Prometheus
rules read). Thresholds come from :mod:`monitor.thresholds`; the forecast rule reads its bands
through :mod:`monitor.read`, as the pages do. Nothing here imports the API.
"""
