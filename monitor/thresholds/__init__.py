"""Alert thresholds: the defaults (:mod:`.defaults`, the one place they are defined) and a group's
thresholds in force with where each came from (:mod:`.learned`: its override, learned from its
finished healthy runs, or the default). Read by the detectors, the exporter and the pages alike, so
they all agree."""
