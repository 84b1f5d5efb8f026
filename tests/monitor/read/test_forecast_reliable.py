"""A forecast whose band spans many decades says "no reliable prediction" and gives the band, never a
point value (issue 35): in the API's sentence, the forecast panel's sentence and its figure, on
SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from hyperwatch.cli import main
from hyperwatch.monitor.analysis.forecast import fmt_value
from hyperwatch.monitor.read.forecasts import UNRELIABLE_RATIO
from hyperwatch.monitor.store import SqlStore
from tests.monitor.api.test_forecast_api import PARAMS, STEPS, layer_points, seed
from tests.monitor.conftest import AUTH, create_run, post_points

SCATTER = {2: 1e-4, 3: 1e3, 4: 1e-3, 5: 1e4}
"""Each size's peak scaled by a wild factor: the power law fits, its band spans many decades."""


def scattered(c: TestClient) -> int:
    for d, scale in SCATTER.items():
        size = PARAMS[d]
        create_run(c, f"d{d}", group="scatter", depth=d, total_params=size, total_steps=STEPS, tokens=8192 * STEPS)
        post_points(c, f"d{d}", layer_points(size, range(STEPS), scale))  # type: ignore[arg-type]
        r = c.post("/api/v1/runs", json={"name": f"d{d}", "status": "finished"}, headers=AUTH)
        assert r.status_code == 200, r.text
    return int(next(g["id"] for g in c.get("/api/v1/groups").json() if g["name"] == "scatter"))


def test_a_band_of_many_decades_is_no_prediction(client: TestClient) -> None:
    gid = scattered(client)
    r = client.get(f"/api/v1/groups/{gid}/forecast", params={"params": 3.3e7, "name": "attention_z"})
    assert r.status_code == 200, r.text
    peak = r.json()["indicators"]["attention_z"]["peak"]
    assert peak["upper"] / peak["lower"] > UNRELIABLE_RATIO and peak["reliable"] is False
    s = peak["sentence"]
    band = f"90% band {fmt_value(peak['lower'])} to {fmt_value(peak['upper'])}"
    assert s.startswith("peak attention Z: no reliable prediction at 33M params (") and band in s, s
    assert "predicted" not in s and fmt_value(peak["predicted"]) not in s, s
    panel = client.get(f"/ui/data/groups/{gid}/forecast", params={"target": 3.3e7, "name": "attention_z"}).json()
    assert panel["sentence"] == s
    traces: list[dict[str, Any]] = panel["figure"]["data"]
    assert not [t for t in traces if t.get("name") == "forecast"]  # no star at a point value
    (no,) = [t for t in traces if t.get("name") == "no reliable prediction"]
    assert no["y"] == [peak["lower"], peak["upper"]] and no["x"] == [3.3e7, 3.3e7]


def test_a_narrow_band_still_predicts_a_value(client: TestClient) -> None:
    gid = seed(client)
    peak = client.get(f"/api/v1/groups/{gid}/forecast", params={"params": 3.3e6}).json()["indicators"]["attention_z"]
    peak = peak["peak"]
    assert peak["reliable"] is True and f"{fmt_value(peak['predicted'])} predicted at" in peak["sentence"]


def test_the_cli_table_prints_no_value_for_a_band_of_many_decades(
    sqlite_client: TestClient, sqlite_store: SqlStore, capsys: Any
) -> None:
    """``hyperwatch forecast``'s table says "no reliable" where the API says reliable: false."""
    gid = scattered(sqlite_client)
    api = sqlite_client.get(f"/api/v1/groups/{gid}/forecast", params={"params": 3.3e7, "name": "attention_z"}).json()
    peak = api["indicators"]["attention_z"]["peak"]
    assert peak["reliable"] is False
    url = sqlite_store.engine.url.render_as_string(hide_password=False)
    assert main(["forecast", "--db", url, "--group", "scatter", "--params", "3.3e7", "--name", "attention_z"]) == 0
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if line.startswith("attention_z ")]
    assert "no reliable" in row and fmt_value(peak["predicted"]) not in row, row
    assert peak["sentence"] in out
