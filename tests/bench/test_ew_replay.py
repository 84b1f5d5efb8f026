"""``bench/early_warning/ew_replay.py``: the service's detectors replayed offline on recorded batches. The in-memory
reader reads as the SQL store does (re-sent steps, NaN), the replay raises what the store's ingest
with the detector raises, and the one-pass trace gives the full replay's alerts at any threshold set."""

from __future__ import annotations

import math
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench" / "early_warning"))

from ew_gauges import recorded_thresholds, with_step_statistics, with_thresholds  # noqa: E402
from ew_prom import at_pace  # noqa: E402
from ew_replay import (  # noqa: E402
    MemoryReader,
    RunTrace,
    compare_recorded,
    decode_value,
    replay,
    threshold_spans,
    to_columns,
)

from hyperwatch.hooks.columns import PointColumns  # noqa: E402
from hyperwatch.monitor.alerting.detectors import detect  # noqa: E402
from hyperwatch.monitor.store import SqlStore, migrate  # noqa: E402
from hyperwatch.monitor.store.base import WindowReader  # noqa: E402
from hyperwatch.monitor.store.entities import NewAlert  # noqa: E402
from hyperwatch.monitor.store.points import last_per_key  # noqa: E402

Raw = list[list[list[Any]]]
Metric = Callable[[int], float]


def wire(v: float) -> Any:
    return v if math.isfinite(v) else ("NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity"))


def recording(
    steps: int,
    metrics: dict[tuple[str, int | None], Metric],
    loss: Metric = lambda s: 2.0 + 2.0 * math.exp(-s / 30),
    every: int = 4,
    per_batch: int = 2,
) -> Raw:
    """Batches as the hooks send them: the loss every step, the metrics every ``every`` steps, a batch
    per ``per_batch`` logged steps."""
    batches: Raw = []
    cur: list[list[Any]] = []
    for s in range(steps):
        cur.append(["loss", None, s, wire(loss(s))])
        if s % every == 0:
            cur += [[name, layer, s, wire(f(s))] for (name, layer), f in metrics.items()]
            if (s // every) % per_batch == per_batch - 1:
                batches.append(cur)
                cur = []
    if cur:
        batches.append(cur)
    return batches


def lse_rises_and_settles(s: int) -> float:
    return 3.0 * (16 / 3) ** (min(s, 40) / 40)  # 3 -> 16 by step 40, then flat


def z_climbs(s: int) -> float:
    return 10.0 * math.exp(0.05 * s)


HEALTHY_LSE = recording(
    200,
    {
        ("attention_lse_max", 0): lse_rises_and_settles,
        ("attention_lse_max.h0", 0): lse_rises_and_settles,
        ("attention_lse_max.h1", 0): lambda s: 2.0,
        ("attention_z", 0): lambda s: 9.0,
    },
)
Z_CLIMB = recording(200, {("attention_z", 0): z_climbs, ("attention_z", 1): lambda s: 9.0})
NAN_LOSS = recording(200, {("attention_z", 0): lambda s: 9.0}, loss=lambda s: math.nan if s >= 100 else 2.0)
PRE_FAULT = recording(200, {("attention_lse_max", 0): lambda s: 60.0 if s == 40 else 5.0})


def cols_of(raw: Raw) -> list[PointColumns]:
    return [to_columns(b) for b in raw]


def alerts_at(raw: Raw, thresholds: dict[str, Any] | None = None) -> list[tuple[str, int, str, int | None]]:
    return [(a[0], a[2], a[3], a[4]) for a in replay(cols_of(raw), thresholds)]


def test_values_decode_as_the_wire_does() -> None:
    assert math.isnan(decode_value("NaN")) and decode_value("-Infinity") == -math.inf and decode_value(3) == 3.0
    with pytest.raises(ValueError, match="NaN, Infinity"):
        decode_value("nan")
    with pytest.raises(ValueError, match="name, layer_or_null, step, value"):
        to_columns([["loss", None, 1]])


F4 = {"growth_factor": 4.0}  # the growth factor these synthetic climbs were shaped for (the default was 4)


def test_replay_at_the_defaults_raises_what_each_run_should() -> None:
    # the LSE's 5.3x climb is a growth (at 36: the fitted rise of 9 points passes ln 4, above the floor 10);
    # it settles at 16, under the ceiling 50: nothing more
    assert alerts_at(HEALTHY_LSE, F4) == [("z_growth", 36, "attention_lse_max", 0)]
    # attention Z: a growth once above its floor 50 (step 36), the ceiling 50^2 passed at 112 (10 e^{5.6} = 2704)
    z = alerts_at(Z_CLIMB, F4)
    assert ("z_growth", 36, "attention_z", 0) in z and ("logit_ceiling", 112, "attention_z", 0) in z
    assert min(a[1] for a in z) == 36 and {a[3] for a in z} == {0}
    assert alerts_at(NAN_LOSS)[:2] == [("nan_loss", 100, "loss", None), ("nan_loss", 101, "loss", None)]
    assert alerts_at(PRE_FAULT) == [("logit_ceiling", 40, "attention_lse_max", 0)]  # once per crossing
    assert alerts_at(HEALTHY_LSE, {**F4, "attention_lse_max_growth_floor": 20}) == []


@pytest.fixture
def sqlite(tmp_path: Path) -> Iterator[SqlStore]:
    s = SqlStore(f"sqlite:///{tmp_path}/hyperwatch.db")
    migrate.upgrade(s.engine)
    yield s
    s.close()


def resent(raw: Raw) -> Raw:
    """The batches with steps sent again: each batch repeats the previous batch's last metric step
    with other values (last write wins), one key twice within a batch, and a late NaN and +Inf."""
    out: Raw = []
    for i, b in enumerate(raw):
        b = [list(p) for p in b]
        if i:
            last = max(p[2] for p in raw[i - 1] if p[0] != "loss")
            b += [[p[0], p[1], p[2], wire(decode_value(p[3]) * 1.5)] for p in raw[i - 1] if p[2] == last]
        if i == 5:
            b += [["attention_z", 1, 8, "NaN"], ["attention_z", 1, 12, "Infinity"], ["attention_z", 1, 12, 9.0]]
        out.append(b)
    return out


def test_the_memory_reader_reads_as_the_sql_store(sqlite: SqlStore) -> None:
    run, _ = sqlite.upsert_run("default", "r", {})
    mem = MemoryReader()
    for b in cols_of(resent(Z_CLIMB)):
        sqlite.ingest(run.id, uuid.uuid4().hex, b)
        mem.store(last_per_key(b))
    keys = [(n, la, s) for n, la in (("attention_z", 0), ("attention_z", 1), ("loss", None), ("nope", 3))
            for s in (0, 1, 8, 13, 64, 100, 199, 400)]  # fmt: skip
    for limit in (1, 3, 16, 50, 128):
        want, got = sqlite.trailing_points(run.id, keys, limit), mem.trailing_points(run.id, keys, limit)
        assert [[(s, repr(v)) for s, v in w] for w in got] == [[(s, repr(v)) for s, v in w] for w in want], limit
    # step 8 re-sent x1.5, then NaN (the last write wins); 12 sent +Inf then 9.0 in one batch: 9.0
    assert [[repr(v) for v in w] for w in mem.trailing_windows(1, [("attention_z", 1, 13)], 2)] == [["nan", "9.0"]]
    with pytest.raises(ValueError, match="at least 1"):
        mem.trailing_points(1, keys, 0)


@pytest.mark.parametrize("name", ["healthy_lse", "z_climb", "nan_loss", "pre_fault"])
def test_replay_raises_what_the_store_ingest_with_the_detector_raises(sqlite: SqlStore, name: str) -> None:
    raw = resent({"healthy_lse": HEALTHY_LSE, "z_climb": Z_CLIMB, "nan_loss": NAN_LOSS, "pre_fault": PRE_FAULT}[name])
    run, _ = sqlite.upsert_run("default", name, {})
    for b in cols_of(raw):  # as the ingest route: the batch stored, its last value per key judged
        judged = last_per_key(b)

        def detector(reader: WindowReader, judged: PointColumns = judged) -> list[NewAlert]:
            return detect(reader, run.id, judged, None)

        sqlite.ingest(run.id, uuid.uuid4().hex, b, detector=detector)
    stored = sqlite.list_alerts(run_id=run.id, limit=100_000)
    want = sorted((a.rule, a.severity, a.step, a.name, -1 if a.layer is None else a.layer) for a in stored)
    got = sorted((a[0], a[1], a[2], a[3], -1 if a[4] is None else a[4]) for a in replay(cols_of(raw)))
    assert got == want and want


THRESHOLD_SETS: list[dict[str, Any]] = [
    {},
    {"attention_lse_max_limit": 15},
    {"attention_lse_max_limit": 5, "growth_factor": 2},
    {"growth_factor": 16, "attention_z_growth_floor": 10},
    {"attention_lse_max_growth_floor": 3, "growth_factor": 1.5},
    {"growth_info_fraction": 0.25, "attention_z_growth_floor": 400},  # the info tier
    {"growth_info_fraction": 0.5, "attention_lse_max_growth_floor": 20, "attention_lse_max_limit": 30},
    {"sigma_spike_multiple": 2},  # not a trace threshold: replayed in full
    {"growth_window": 8, "growth_min_points": 4},
    {"growth_recent": 0},  # the whole window's fit alone: the settling climbs count again
    {"growth_recent": 0, "growth_info_fraction": 0.5, "attention_lse_max_growth_floor": 20},
]


@pytest.mark.parametrize("raw", [HEALTHY_LSE, Z_CLIMB, NAN_LOSS, resent(PRE_FAULT), resent(Z_CLIMB)])
def test_the_trace_gives_the_full_replays_alerts_at_every_threshold_set(raw: Raw) -> None:
    batches = cols_of(raw)
    trace = RunTrace(batches)
    for th in THRESHOLD_SETS:
        full = replay(batches, th)
        assert trace.alerts(th) == full, th
        counted = [a[2] for a in full if a[1] in ("warning", "critical") and a[0] != "max_vio_collapse"]
        assert trace.first_warnings(th, 100) == (
            min(counted, default=None),
            min((s for s in counted if s >= 100), default=None),
        ), th
    assert trace.fast({"growth_factor": 8}) is not None and trace.fast({"spike_window": 20}) is None


def test_info_alerts_are_replayed_but_never_a_warning() -> None:
    trace = RunTrace(cols_of(HEALTHY_LSE))
    th = {"growth_info_fraction": 0.5, "attention_lse_max_growth_floor": 20, "growth_recent": 0}
    assert [(a[0], a[1]) for a in trace.alerts(th)] == [("z_growth", "info")]
    assert trace.first_warnings(th, None) == (None, None)
    assert trace.alerts({**th, "growth_recent": 1}) == []  # the rise settles: with its last half required, quiet


SCRAPES: dict[str, list[float | None]] = {
    'hyperwatch_run_logit_ceiling{project="default",run="r"}': [None, 50.0, 50.0],
    'hyperwatch_run_growth_log_factor{project="default",run="r"}': [None, math.log(4.0), math.log(4.0)],
    'hyperwatch_run_attention_lse_max_max{project="default",run="r"}': [None, 3.0, 60.0],
}


def test_threshold_gauges_are_read_and_rewritten() -> None:
    th = recorded_thresholds(SCRAPES)
    assert th["attention_lse_max_limit"] == 50.0 and th["growth_factor"] == pytest.approx(4.0)
    assert th["growth_recent"] == 0.0 and "growth_recent" not in recorded_thresholds({})  # older than its gauge
    out, missing = with_thresholds(SCRAPES, {"attention_lse_max_limit": 80, "growth_factor": 8}, ["growth_factor",
                                   "attention_lse_max_limit", "mlp_rms_growth_floor", "spike_window"])  # fmt: skip
    assert out['hyperwatch_run_logit_ceiling{project="default",run="r"}'] == [None, 80.0, 80.0]
    assert out['hyperwatch_run_growth_log_factor{project="default",run="r"}'][2] == pytest.approx(math.log(8))
    assert missing == ["spike_window"]  # no gauge at all
    # a threshold gauge the recording lacks (younger than it) is written beside the growth factor's, scrape for scrape
    assert out['hyperwatch_run_mlp_rms_growth_floor{project="default",run="r"}'] == [None, 500.0, 500.0]
    out, missing = with_thresholds(SCRAPES, {"growth_recent": 0}, ["growth_recent"])
    assert out['hyperwatch_run_growth_recent{project="default",run="r"}'] == [None, 0.0, 0.0] and missing == []
    assert 'hyperwatch_run_growth_recent{project="default",run="r"}' not in SCRAPES  # the input is left as it was


def test_at_pace_repeats_or_thins_the_scrapes_with_their_steps() -> None:
    cols = {"a": [1.0, None, 3.0], "b": [4.0, 5.0]}  # a shorter column reads as missing at the end
    assert at_pace(cols, [0, 4, 8], 1) == (
        {"a": [1.0, None, 3.0], "b": [4.0, 5.0, None]}, [0, 4, 8])  # fmt: skip
    assert at_pace(cols, [0, 4, 8], 2) == (
        {"a": [1.0, 1.0, None, None, 3.0, 3.0], "b": [4.0, 4.0, 5.0, 5.0, None, None]}, [0, 0, 4, 4, 8, 8])  # fmt: skip
    assert at_pace(cols, [0, 4, 8, 12], 0.5) == ({"a": [None, None], "b": [5.0, None]}, [4, 12])
    for bad in (1.5, 0.3, 0.0, -1.0):
        with pytest.raises(ValueError, match="a whole number of scrapes per logged step"):
            at_pace(cols, [0, 4, 8], bad)


def test_sigma_statistics_are_written_where_a_recording_lacks_them() -> None:
    key = 'hyperwatch_run_loss_nats{project="default",run="r"}'
    loss: list[float | None] = [3.0 + 0.01 * (i % 3) for i in range(20)]
    loss[18] = None  # a scrape without the loss: no statistic there, and no value counted
    loss[19] = 5.0
    out = with_step_statistics({key: loss}, {}, list(range(0, 80, 4)))
    mean = out['hyperwatch_run_loss_spike_mean{project="default",run="r"}']
    assert mean[:16] == [None] * 16 and mean[18] is None  # 16 values before the latest are needed
    assert mean[19] == pytest.approx(sum(v for v in loss[2:18] if v is not None) / 16)
    assert out['hyperwatch_run_loss_spike_streak{project="default",run="r"}'][19] == 5.0
    assert not any(k.startswith("hyperwatch_run_loss_shift") for k in out)  # 19 values: fewer than 6 + 16
    assert not any(k.startswith("hyperwatch_run_grad_norm_spike") for k in out)  # no grad norm recorded
    recorded = {**out, key: [0.0] * 20}
    # a recording that holds them keeps them
    assert with_step_statistics(recorded, {}, list(range(0, 80, 4))) == recorded


def test_compare_recorded_names_what_differs() -> None:
    trace = RunTrace(cols_of(PRE_FAULT))
    stored = [{"rule": "logit_ceiling", "severity": "critical", "step": 40, "name": "attention_lse_max", "layer": 0}]
    # the recording ran at factor 4, and (no growth_recent gauge beside its growth factor's) before growth_recent
    assert compare_recorded(trace, SCRAPES, stored) == ({**F4, "growth_recent": 0.0}, set(), set())
    over, only_service, only_replay = compare_recorded(trace, {}, [*stored, {**stored[0], "step": 44}])
    assert (over, only_replay) == ({}, set()) and only_service == {("logit_ceiling", 44, "attention_lse_max", 0)}


def test_a_group_that_learned_mid_run_is_compared_stretch_by_stretch() -> None:
    """A sibling finished while the run trained: its logit ceiling went from 50 to a learned 80 at logged step 20,
    so the service stored no alert for the LSE of 60 at step 40. Replayed at the first thresholds alone, the
    replay would raise one; stretch by stretch it raises what the service did."""
    steps = list(range(0, 200, 4))
    lab = '{project="default",run="r"}'
    scrapes: dict[str, list[float | None]] = {
        f"hyperwatch_run_logit_ceiling{lab}": [None, *[50.0] * 4, *[80.0] * 45],
        f"hyperwatch_run_growth_log_factor{lab}": [None, *[math.log(8.0)] * 49],
        f"hyperwatch_run_growth_recent{lab}": [None, *[1.0] * 49],
    }
    assert threshold_spans(scrapes, steps) == [(0, {}), (20, {"attention_lse_max_limit": 80.0})]
    trace = RunTrace(cols_of(PRE_FAULT))
    assert compare_recorded(trace, scrapes, [], steps) == ({}, set(), set())
    assert compare_recorded(trace, scrapes, []) == ({}, set(), {("logit_ceiling", 40, "attention_lse_max", 0)})
