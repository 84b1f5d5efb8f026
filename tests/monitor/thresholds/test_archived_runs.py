"""Archived runs (migration 0012) are out of a group's learned thresholds (issue 35), on SQLite and
PostgreSQL: archiving a finished run reads the group's runs again, an archived run's peaks are never
learned from, its final loss is never the best the others are judged against, and unarchiving it
brings it back."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from hyperwatch.monitor.store import SqlStore
from tests.monitor.conftest import AUTH, create_run, post_points

MULTIPLE = 3.0


def _run(client: TestClient, name: str, head_peak: float, loss_offset: float = 0.0) -> int:
    """A finished run of group "fam": four steps, its heads' max LSE peaking at ``head_peak``."""
    run = create_run(client, name, group="fam")
    for step in range(4):
        head = head_peak if step == 2 else 8.0
        post_points(
            client,
            name,
            [
                {"name": "loss", "step": step, "value": 3.0 - 0.1 * step + loss_offset},
                {"name": "attention_lse_max", "layer": 0, "step": step, "value": head},
            ],
        )
    r = client.patch(f"/api/v1/runs/{run['id']}", json={"status": "finished"}, headers=AUTH)
    assert r.status_code == 200, r.text
    return int(run["id"])


def _family(client: TestClient) -> int:
    body = {"name": "fam", "learn_thresholds": True, "thresholds": {"learn_multiple": MULTIPLE}}
    r = client.post("/api/v1/groups", json=body, headers=AUTH)
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def _ceiling(client: TestClient, gid: int) -> dict[str, Any]:
    r = client.get(f"/api/v1/groups/{gid}/thresholds")
    assert r.status_code == 200, r.text
    (row,) = [row for row in r.json() if row["key"] == "attention_lse_max_limit"]
    return dict(row)


def _archive(client: TestClient, run_id: int, archived: bool) -> None:
    r = client.patch(f"/api/v1/runs/{run_id}", json={"archived": archived}, headers=AUTH)
    assert r.status_code == 200 and r.json()["archived"] is archived, r.text


def test_an_archived_run_is_not_learned_from_and_unarchiving_brings_it_back(
    client: TestClient, store: SqlStore
) -> None:
    gid = _family(client)
    _run(client, "h1", 18.0)
    _run(client, "h2", 20.0)
    test_run = _run(client, "scratch-test", 40.0)
    ceiling = _ceiling(client, gid)
    assert (ceiling["source"], ceiling["value"]) == ("learned", MULTIPLE * 40.0)
    assert "run scratch-test" in ceiling["detail"]

    _archive(client, test_run, True)
    ceiling = _ceiling(client, gid)
    assert (ceiling["source"], ceiling["value"]) == ("learned", MULTIPLE * 20.0)
    assert "2 finished healthy runs: h1, h2" in ceiling["detail"] and "scratch-test" not in ceiling["detail"]
    learned = store.get_group(gid).learned
    assert learned is not None and learned["excluded"] == {"scratch-test": "archived"}
    health = {h.name: h.archived for h in store.group_run_health(gid)}
    assert health == {"h1": False, "h2": False, "scratch-test": True}

    _archive(client, test_run, False)
    assert _ceiling(client, gid)["value"] == MULTIPLE * 40.0


def test_an_archived_runs_loss_is_not_the_best_the_others_are_judged_against(client: TestClient) -> None:
    """A test run with a far lower loss, once archived, no longer puts the group's real runs "behind the best"."""
    gid = _family(client)
    _run(client, "h1", 18.0)
    _run(client, "h2", 20.0)
    lucky = _run(client, "lucky", 30.0, loss_offset=-2.0)
    before = _ceiling(client, gid)
    assert before["source"] == "default" and "h1 (final loss" in before["detail"]  # h1, h2 2 nats behind lucky

    _archive(client, lucky, True)
    after = _ceiling(client, gid)
    assert (after["source"], after["value"]) == ("learned", MULTIPLE * 20.0)
    assert "2 finished healthy runs: h1, h2" in after["detail"]
