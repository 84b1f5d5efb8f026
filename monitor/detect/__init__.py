"""The detectors' parts: default thresholds (:mod:`.defaults`), trend rules (:mod:`.trends`),
incident explanations (:mod:`.explain`). The entry point stays :func:`monitor.detectors.detect`."""
