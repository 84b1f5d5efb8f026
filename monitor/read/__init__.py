"""The read layer: the only path from the API routes and the pages to the store.

:mod:`.lines` (a group's runs, a run's line of an indicator, the x axes, matching runs by fraction
of training), :mod:`.reader` (plain reads: runs, series index, series, layer matrices, alerts),
:mod:`.live` (what an open page lacks since it last drew), :mod:`.live_notify` and
:mod:`.live_fanout` (news of ingested points, fanned out once per run), :mod:`.forecasts` (the
forecasts' reads). It imports the store, the thresholds and the analysis fits; never the API.
"""
