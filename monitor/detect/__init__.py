"""The detectors' parts: default thresholds (:mod:`.defaults`), a group's thresholds in force and where
each came from (:mod:`.learned`: override, learned from its finished healthy runs, or default), trend
rules (:mod:`.trends`), incident explanations (:mod:`.explain`). The entry point stays
:func:`monitor.detectors.detect`."""
