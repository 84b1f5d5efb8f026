"""Run identity: a run name held by another process's run is refused unless it resumes (migration 0009).

API checks through the app on both databases, then the hooks against the real service: a second
process is refused and sends nothing into the first one's run, resume continues it without the old
"not measured" list, a delivered spool folder is removed and an earlier process's spool is kept apart.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from hyperwatch import hooks
from tests.hooks.support import hf_model
from tests.monitor.conftest import AUTH, create_run
from tests.reliability.support import WRITE_TOKEN, Service, stored, upgrade, wait_until

A, B = "a" * 32, "b" * 32


def post(client: TestClient, **body: object) -> tuple[int, dict]:
    r = client.post("/api/v1/runs", json={"name": "r1", **body}, headers=AUTH)
    return r.status_code, r.json()


def test_another_process_is_refused_unless_it_resumes(client: TestClient) -> None:
    code, first = post(client, attach_id=A, unavailable={"mlp_rms@0": "no MLP found"})
    assert code == 201
    code, again = post(client, attach_id=A)  # the same process (a retried POST): its own run
    assert code == 200 and again["id"] == first["id"]
    client.patch(f"/api/v1/runs/{first['id']}", json={"status": "finished"}, headers=AUTH)
    code, refused = post(client, attach_id=B, status="running")
    assert code == 409
    assert "resume=True" in refused["detail"] and "status finished" in refused["detail"]
    code, resumed = post(client, attach_id=B, resume=True, status="running")
    assert code == 200 and resumed["id"] == first["id"] and resumed["status"] == "running"
    assert resumed["unavailable"] == {}  # the old process's list does not stay above the new one's charts
    code, _ = post(client, attach_id=A)  # the first process is the one refused now
    assert code == 409


def test_clients_without_an_id_create_or_update_by_name_as_before(client: TestClient) -> None:
    first = create_run(client, depth=2)
    second = create_run(client, depth=3)
    assert second["id"] == first["id"] and second["depth"] == 3
    code, body = post(client, attach_id=A)  # a run created without an id is not a hooks process's to take
    assert code == 409 and "resume=True" in body["detail"]


def test_a_malformed_attach_id_is_a_422_naming_it(client: TestClient) -> None:
    code, body = post(client, attach_id="not hex!")
    assert code == 422 and "attach_id" in str(body)


@pytest.fixture(params=["sqlite", "postgresql"])
def live(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Service, str]]:
    url = str(request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url"))
    upgrade(url)
    svc = Service(url, tmp_path / "service.log")
    svc.start()
    try:
        yield svc, url
    finally:
        svc.kill()


def attach(svc: Service, spool: Path, **kw: object) -> hooks.Monitor:
    sink = hooks.HttpSink(svc.url, token=WRITE_TOKEN, spool=spool, backoff=(0.05, 0.2), close_timeout=30)
    return hooks.attach(hf_model("llama"), run="same-name", sink=sink, every=1, **kw)


def test_hooks_second_process_is_refused_then_resumes(
    live: tuple[Service, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    svc, url = live
    spool = tmp_path / "spool"
    caplog.set_level(logging.INFO, logger="hyperwatch.hooks")
    first = attach(svc, spool)
    for step in range(3):
        first.step(step, loss=1.0)
    first.close()
    assert stored(url, "same-name").keys >= {("loss", -1, s) for s in range(3)}
    assert not (spool / "same-name").exists()  # delivered: the spool folder is gone
    assert any("/runs/" in r.getMessage() and "is at http://" in r.getMessage() for r in caplog.records)

    second = attach(svc, spool)  # a new process, same name, no resume: refused, nothing merged
    for step in range(100, 103):
        second.step(step, loss=2.0)
    second.close()
    assert second.sink is not None and "resume=True" in second.sink.refused  # type: ignore[attr-defined]
    assert not any(step >= 100 for _n, _l, step in stored(url, "same-name").keys)
    assert (spool / "same-name" / "pending").is_dir()  # kept for the run it was written for

    third = attach(svc, spool, resume=True)  # continues the stored run
    for step in range(3, 6):
        third.step(step, loss=3.0)
    third.close()
    keys = stored(url, "same-name").keys
    assert {("loss", -1, s) for s in range(6)} <= keys
    assert not any(step >= 100 for _n, _l, step in keys)  # the refused process's spool was set aside
    aside = [p for p in spool.iterdir() if p.name.startswith("same-name.earlier-")]
    assert len(aside) == 1 and list((aside[0] / "pending").iterdir())
    assert wait_until(lambda: not (spool / "same-name").exists(), timeout=10)


def test_a_run_in_a_named_project_gets_its_points(live: tuple[Service, str], tmp_path: Path) -> None:
    """The batch names its run; the project travels in the query (a run of project "team-a" posted
    without it was looked up in "default": 404, retried forever, nothing stored)."""
    svc, url = live
    mon = attach(svc, tmp_path / "spool", project="team-a")
    for step in range(3):
        mon.step(step, loss=1.0)
    mon.close()
    assert {("loss", -1, s) for s in range(3)} <= stored(url, "same-name").keys
    assert not (tmp_path / "spool" / "same-name").exists()  # delivered, not left spooled
