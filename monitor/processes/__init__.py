"""Child processes the demo, the benchmarks and the tests start (:mod:`.children`: the service,
Prometheus, Alertmanager), each dying with its parent (:mod:`.lifetime`)."""
