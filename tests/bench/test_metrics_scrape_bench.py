"""``bench/metrics_scrape.py`` on a small load: every part of a scrape timed, the new statistics exported."""

from __future__ import annotations

import pytest

from bench import metrics_scrape
from bench.load import database
from hyperwatch.monitor.alerting.prometheus import RunCollector
from hyperwatch.monitor.store import SqlStore


def test_the_bench_times_each_part_and_the_load_feeds_the_step_statistics(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        metrics_scrape.main(["--db", "sqlite", "--runs", "1", "--layers", "2", "--steps", "20", "--repeats", "1"]) == 0
    )
    out = capsys.readouterr().out
    for part in ("latest values (read)", "Z spike baselines", "growth rises (new)", "whole exposition"):
        assert f"| {part} |" in out
    assert "1 running runs x 2 layers x 20 logged steps (380 points)" in out
    with database("sqlite") as url:  # the load gives every statistic a verdict: the parts time real work
        store = SqlStore(url)
        try:
            metrics_scrape.load(store, 1, 2, 24)  # the shift needs 6 + 16
            names = {f.name for f in RunCollector(store).collect() if f.samples}
        finally:
            store.close()
    for m in ("attention_z", "attention_lse_max", "attention_rms", "mlp_rms", "router_z", "output_z"):
        assert f"hyperwatch_run_{m}_growth_rise" in names
    assert {
        "hyperwatch_run_loss_spike_mean",
        "hyperwatch_run_loss_shift_error",
        "hyperwatch_run_grad_norm_spike_sigma",
    } <= names


def test_bad_sizes_are_refused_naming_the_flag() -> None:
    with pytest.raises(SystemExit):
        metrics_scrape.main(["--runs", "0"])
