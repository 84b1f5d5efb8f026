"""Two writers recording alerts of one run at once make one incident, not two (issue 21's note).

On PostgreSQL two transactions (two Alertmanager notifications, or a notification beside a batch's
detectors) each read the run's latest incident, found none, and each opened one. The first writer
is held between its read and its write until the second has finished (or 1.5 s have passed, when
the second waits for the first's lock): without the lock the second commits its own incident in
that gap. SQLite serializes its writers anyway; the same test holds there.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from hyperwatch.monitor.store import SqlStore, incidents
from hyperwatch.monitor.store.entities import NewAlert


def _alert(step: int) -> NewAlert:
    return NewAlert("z_growth", "warning", "attention_z", 1, step, 50.0 + step, 10.0, "attention Z rose", "prometheus")


def test_concurrent_writers_of_one_run_share_one_incident(store: SqlStore, monkeypatch: pytest.MonkeyPatch) -> None:
    run, _ = store.upsert_run("default", "r", {})
    first_read, second_done = threading.Event(), threading.Event()
    original = incidents._latest
    calls: list[int] = []

    def held_latest(*args: Any) -> Any:
        found = original(*args)
        calls.append(1)
        if len(calls) == 1:  # the first writer: hold it between its read and its write
            first_read.set()
            second_done.wait(1.5)
        return found

    monkeypatch.setattr(incidents, "_latest", held_latest)
    errors: list[BaseException] = []

    def write(step: int, done: threading.Event | None) -> None:
        try:
            store.add_alerts(run.id, [_alert(step)])
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)
        finally:
            if done is not None:
                done.set()

    first = threading.Thread(target=write, args=(10, None))
    first.start()
    assert first_read.wait(30)
    second = threading.Thread(target=write, args=(11, second_done))
    second.start()
    first.join(60)
    second.join(60)
    assert not errors, errors
    found = store.list_incidents(run_id=run.id)
    assert len(found) == 1, [(i.id, i.first_step, i.events) for i in found]
    assert found[0].events == 2 and found[0].first_step == 10 and found[0].last_step == 11
