"""Service outage: SIGKILL the real service mid-run, restart it; the spool is bounded and says so.

Issue #3 and #8: every point of a run of thousands of logged steps arrives exactly once (checked
in the database: one row per key, and the stored batches' point counts add up to the points, so
no point was ingested twice under two keys); the training thread never makes a network call and
never writes the spool itself (both happen on the monitor's threads), which is why its step time
does not depend on the service (the figure: ``bench/outage.py``).
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from hyperwatch import hooks
from hyperwatch.hooks.schema import Batch, Point
from hyperwatch.hooks.sinks import HttpSink, RunInfo, SinkError, client
from hyperwatch.hooks.sinks.folder import DROPPED_FILE, pending_files, read_json
from hyperwatch.hooks.sinks.http import DEFAULT_SPOOL_MAX_BYTES, default_spool_max_bytes
from tests.hooks.support import bundled_model
from tests.reliability.support import WRITE_TOKEN, Service, free_port, stored, upgrade, wait_until

STEPS = 3000  # logged steps, every step logged: 3 run-level points each


def test_service_sigkilled_and_restarted_every_point_exactly_once(
    service: Service, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: dict[str, set[str]] = {"request": set(), "write": set()}
    real_request, real_write = client.request, HttpSink.write

    def spy_request(*args: Any, **kwargs: Any) -> client.Response:
        threads["request"].add(threading.current_thread().name)
        return real_request(*args, **kwargs)

    def spy_write(self: HttpSink, batch: Batch) -> None:
        threads["write"].add(threading.current_thread().name)
        real_write(self, batch)

    monkeypatch.setattr(client, "request", spy_request)
    monkeypatch.setattr(HttpSink, "write", spy_write)

    sink = HttpSink(service.url, token=WRITE_TOKEN, spool=tmp_path / "spool", backoff=(0.05, 0.5), close_timeout=120)
    mon = hooks.attach(bundled_model(), run="outage-1", sink=sink, every=1, depth=2)
    folder = tmp_path / "spool" / "outage-1"
    expected: set[tuple[str, int, int]] = set()

    def train(steps: range) -> None:
        for step in steps:
            mon.step(step, loss=3.0 - step * 1e-4, lr=1e-3, tokens=step * 64)
            # host_rss: the process's memory, a run-level point on every logged step (hooks.environment)
            expected.update({("loss", -1, step), ("lr", -1, step), ("tokens", -1, step), ("host_rss", -1, step)})

    third = STEPS // 3
    train(range(0, third))
    assert wait_until(lambda: sink.delivered > 0, timeout=60)
    service.kill()  # SIGKILL while the sink streams: a request may be cut mid-way
    train(range(third, 2 * third))
    assert wait_until(lambda: len(pending_files(folder)) > 0, timeout=60), "the spool did not take the outage"
    assert "posting points" in sink.last_error or "creating the run" in sink.last_error
    service.start()  # same port, same database
    train(range(2 * third, STEPS))
    mon.close()

    got = stored(service.db_url, "outage-1")
    assert got.keys == expected
    assert got.points == got.distinct == len(expected) == 4 * STEPS
    assert got.ingested == got.points, "a point was ingested twice (resent under a new key)"
    assert pending_files(folder) == [] and sink.spool_bytes == 0
    assert sink.dropped_points == 0
    # The training thread (MainThread) neither wrote the spool nor touched the network.
    assert threads["write"] == {"hyperwatch-emitter"}
    assert threads["request"] == {"hyperwatch-http-sink"}


def test_spool_is_bounded_drops_newest_and_says_so(
    tmp_path: Path, sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()  # nothing listens yet: the service is down
    spool = tmp_path / "spool"
    one = len(json.dumps(Batch("bounded-1", [Point("loss", 100, 1.0)]).to_json(), separators=(",", ":")))
    limit = 40 * one
    sink = HttpSink(
        f"http://127.0.0.1:{port}", token=WRITE_TOKEN, spool=spool, backoff=(0.05, 0.2), max_spool_bytes=limit
    )
    sink.start(RunInfo("bounded-1"))
    caplog.set_level(logging.WARNING, logger="hyperwatch.hooks.sinks.http")
    for step in range(200):
        sink.write(Batch("bounded-1", [Point("loss", step, float(step))]))  # returns: never blocks
    folder = spool / "bounded-1"
    on_disk = sum(p.stat().st_size for p in pending_files(folder))
    assert on_disk == sink.spool_bytes <= limit
    kept = len(pending_files(folder))
    assert 0 < kept < 200 and sink.dropped_batches == 200 - kept == sink.dropped_points
    # The oldest are kept, the newest dropped: the gap is one known span of steps.
    assert sink.dropped_steps == (kept, 199)
    assert read_json(folder / DROPPED_FILE) == {"points": 200 - kept, "batches": 200 - kept, "steps": [kept, 199]}
    drops = [r for r in caplog.records if "DROPPING" in r.getMessage()]
    assert len(drops) == 1 and drops[0].levelno == logging.ERROR  # loud, but once, not 200 times
    assert "HYPERWATCH_SPOOL_MAX_BYTES" in drops[0].getMessage()

    upgrade(sqlite_url)
    svc = Service(sqlite_url, tmp_path / "service.log", port=port)
    svc.start()
    try:
        assert wait_until(lambda: sink.spool_bytes == 0, timeout=60)
        sink.write(Batch("bounded-1", [Point("loss", 500, 5.0)]))  # room again: spooled and delivered
        assert sink.flush(60)
        assert any("spooling again" in r.getMessage() for r in caplog.records)
        got = stored(sqlite_url, "bounded-1")
        assert {k[2] for k in got.keys} == set(range(kept)) | {500}
        assert got.ingested == got.points == kept + 1
    finally:
        sink.close()
        svc.kill()


def test_spool_bound_setting_is_validated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("HYPERWATCH_SPOOL_MAX_BYTES", raising=False)
    assert default_spool_max_bytes() == DEFAULT_SPOOL_MAX_BYTES == 1 << 30
    monkeypatch.setenv("HYPERWATCH_SPOOL_MAX_BYTES", "5000")
    assert HttpSink("http://127.0.0.1:9", spool=tmp_path).max_spool_bytes == 5000
    for bad in ("1GB", "0", "-3"):
        monkeypatch.setenv("HYPERWATCH_SPOOL_MAX_BYTES", bad)
        with pytest.raises(SinkError, match="HYPERWATCH_SPOOL_MAX_BYTES"):
            HttpSink("http://127.0.0.1:9", spool=tmp_path)
    with pytest.raises(SinkError, match="max_spool_bytes"):
        HttpSink("http://127.0.0.1:9", spool=tmp_path, max_spool_bytes=0)


def test_unwritable_spool_counts_the_drop_and_training_goes_on(tmp_path: Path) -> None:
    sink = HttpSink(f"http://127.0.0.1:{free_port()}", spool=tmp_path / "spool", backoff=(0.05, 0.2), close_timeout=0.1)
    sink.start(RunInfo("ro-1"))
    pending = tmp_path / "spool" / "ro-1" / "pending"
    pending.rename(tmp_path / "elsewhere")
    pending.write_text("not a folder")  # every spool write now fails with an OSError
    sink.write(Batch("ro-1", [Point("loss", 1, 1.0), Point("loss", 2, 2.0)]))
    assert sink.dropped_points == 2 and sink.dropped_steps == (1, 2) and sink.spool_bytes == 0
    sink.close()
