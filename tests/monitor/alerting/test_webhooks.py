"""Notifications without Alertmanager: a project's webhooks hear of each new incident once, retried.

Real HTTP both ways (the service under uvicorn, a receiver on ``http.server`` in a thread) and real
databases (SQLite and PostgreSQL): the outbox row is queued in the batch's transaction, the service's
deliverer sends it, a failing receiver is retried until it takes it, and then never again.
"""

from __future__ import annotations

import json
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event, func, select

from hyperwatch.hooks.schema import Point
from hyperwatch.monitor.alerting import notify
from hyperwatch.monitor.core.errors import StoreUnavailableError
from hyperwatch.monitor.store import SqlStore
from hyperwatch.monitor.store.alert_models import IncidentRow, WebhookDeliveryRow
from hyperwatch.monitor.store.entities import NewAlert
from hyperwatch.monitor.store.outbox import RetryPolicy
from tests.monitor.conftest import AUTH, WRITE_TOKEN, create_run, make_client, post_points
from tests.server_thread import start

SECRET = "T0AAA/B0BBB/sEcReTtOkEn1234wxyz"
FAST = {"webhook_retry_initial_s": 0.05, "webhook_retry_max_s": 0.2, "webhook_poll_s": 0.05}


class Receiver:
    """An HTTP endpoint in a thread: answers ``fail_first`` requests with 500, then 200; keeps them all."""

    def __init__(self, fail_first: int = 0, status: int = 500) -> None:
        self.requests: list[tuple[str, Any, Any, int]] = []
        self.fail_first, self.status = fail_first, status
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.lock:
                    code = outer.status if len(outer.requests) < outer.fail_first else 200
                    outer.requests.append((self.path, self.headers, body, code))  # headers: case-insensitive
                self.send_response(code)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok" if code == 200 else b"no")

            def log_message(self, *_args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/services/{SECRET}"

    def accepted(self) -> list[Any]:
        with self.lock:
            return [body for _p, _h, body, code in self.requests if code == 200]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(fail_first=2)
    yield r
    r.close()


def wait_for(check: Callable[[], Any], what: str, deadline_s: float = 60.0) -> Any:
    """Poll ``check`` until it returns something true (a deadline against hanging, not a timing claim)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"never happened: {what}")


def _nan_loss(step: int) -> list[dict[str, object]]:
    return [{"name": "loss", "step": s, "value": 2.0} for s in range(step)] + [
        {"name": "loss", "step": step, "value": "NaN"}
    ]


def _deliveries(store: SqlStore) -> list[tuple[int, int, str, str]]:
    d = WebhookDeliveryRow
    with store.engine.connect() as conn:
        rows = conn.execute(select(d.webhook_id, d.incident_id, d.event, d.status).order_by(d.id)).all()
    return [tuple(r) for r in rows]  # type: ignore[misc]


@pytest.mark.parametrize("fmt", ["slack", "generic"])
def test_an_incident_is_delivered_exactly_once_after_two_failures(
    store: SqlStore, receiver: Receiver, fmt: str
) -> None:
    server, thread, base = start(store, WRITE_TOKEN, public_url="https://hw.example.org/", **FAST)
    try:
        with httpx.Client(base_url=base, headers=AUTH, timeout=30) as c:
            r = c.post("/api/v1/projects/default/webhooks", json={"url": receiver.url, "format": fmt})
            assert r.status_code == 201, r.text
            hook = r.json()
            run = c.post("/api/v1/runs", json={"name": "blowup"}).json()
            r = c.post("/api/v1/points", json={"batch_id": uuid.uuid4().hex, "run": "blowup", "points": _nan_loss(5)})
            assert r.status_code == 201 and r.json()["alerts"] == 1, r.text

            def delivered() -> dict[str, Any] | None:
                got: dict[str, Any] = c.get(f"/api/v1/projects/default/webhooks/{hook['id']}").json()
                return got if got["delivered"] == 1 else None

            state = wait_for(delivered, "the delivery recorded as delivered")
            time.sleep(0.5)  # ten more polls of the outbox: nothing is sent again
            metrics = c.get("/metrics").text
    finally:
        server.should_exit = True
        thread.join(10)
    assert [code for *_rest, code in receiver.requests] == [500, 500, 200]
    assert len(receiver.accepted()) == 1
    ids = {headers["X-HyperWatch-Delivery"] for _p, headers, _b, _c in receiver.requests}
    assert len(ids) == 1  # one delivery, attempted three times, the same body each time
    assert len({json.dumps(body, sort_keys=True) for *_x, body, _c in receiver.requests}) == 1
    assert receiver.requests[0][1]["X-HyperWatch-Event"] == "incident.opened"
    assert (state["pending"], state["delivered"], state["failed"]) == (0, 1, 0)
    last = state["last_delivery"]
    assert (last["state"], last["attempts"], last["http_status"], last["error"]) == ("delivered", 3, 200, None)
    assert 'hyperwatch_webhook_deliveries_total{outcome="retry"}' in metrics
    assert 'hyperwatch_webhook_deliveries_total{outcome="delivered"}' in metrics

    body = receiver.accepted()[0]
    link = f"https://hw.example.org/runs/{run['id']}?name=loss&step=5"
    if fmt == "slack":
        assert set(body) == {"text", "blocks"}
        assert "CRITICAL" in body["text"] and "default/blowup" in body["text"] and "NaN" in body["text"]
        kinds = [b["type"] for b in body["blocks"]]
        assert kinds == ["header", "section", "section", "section"]
        fields = {f["text"].split("\n")[0]: f["text"].split("\n")[1] for f in body["blocks"][2]["fields"]}
        assert fields["*Run*"] == "blowup" and fields["*Rule*"] == "nan_loss" and fields["*Steps*"] == "5"
        assert fields["*Peak*"] == "NaN (loss)"
        assert body["blocks"][3]["text"]["text"] == f"<{link.replace('&', '&amp;')}|Open the run at step 5>"
    else:
        assert body["event"] == "incident.opened"
        assert body["run"] == {"id": run["id"], "name": "blowup", "project": "default"}
        inc = body["incident"]
        assert (inc["rule"], inc["severity"], inc["first_step"], inc["events"]) == ("nan_loss", "critical", 5, 1)
        assert inc["peak_value"] == "NaN" and inc["first_value"] == "NaN"
        assert body["url"] == link and "url_note" not in body
        assert "loss" in body["summary"] and body["incident"]["remedies"]


def test_a_batch_queues_one_delivery_per_webhook_and_a_resent_batch_none(store: SqlStore) -> None:
    client = make_client(store)  # no lifespan: the deliverer does not run, the outbox keeps its rows
    hooks = [
        ("https://hooks.slack.com/services/A/B/one1", {"format": "slack"}),
        ("https://example.org/hook/two2", {"format": "generic", "min_severity": "info"}),
        ("https://example.org/hook/three", {"format": "generic", "min_severity": "critical"}),
    ]
    ids = []
    for url, fields in hooks:
        r = client.post("/api/v1/projects/default/webhooks", json={"url": url, **fields}, headers=AUTH)
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    other = client.post("/api/v1/projects/elsewhere/webhooks", json={"url": hooks[0][0]}, headers=AUTH)
    assert other.status_code == 201
    create_run(client, "r1")
    batch = {"batch_id": "nan-batch-0001", "run": "r1", "points": _nan_loss(3)}
    first = client.post("/api/v1/points", json=batch, headers=AUTH)
    assert first.status_code == 201 and first.json()["alerts"] == 1
    queued = _deliveries(store)
    assert sorted(w for w, *_ in queued) == sorted(ids)  # each of the project's, none of the other's
    assert {(e, s) for _w, _i, e, s in queued} == {("incident.opened", "pending")}
    again = client.post("/api/v1/points", json=batch, headers=AUTH)
    assert again.status_code == 200 and again.json()["duplicate"] is True
    post_points(client, "r1", [{"name": "loss", "step": 4, "value": "NaN"}])  # joins the open incident
    assert _deliveries(store) == queued
    listed = client.get("/api/v1/projects/default/webhooks", headers=AUTH).json()
    assert [(h["pending"], h["delivered"], h["last_delivery"]) for h in listed] == [(1, 0, None)] * 3


def test_a_rolled_back_batch_queues_nothing(store: SqlStore) -> None:
    client = make_client(store)
    client.post("/api/v1/projects/default/webhooks", json={"url": "https://example.org/h/abcd"}, headers=AUTH)
    run = create_run(client, "r1")

    def fail_after_queueing(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.lstrip().upper().startswith("INSERT INTO WEBHOOK_DELIVERIES"):
            raise RuntimeError("the database went away after the outbox row")

    event.listen(store.engine, "after_cursor_execute", fail_after_queueing)
    try:
        with pytest.raises((RuntimeError, StoreUnavailableError)):
            store.ingest(int(str(run["id"])), "doomed-batch-01", [Point("loss", 3, math.nan)], _one_alert("critical"))
    finally:
        event.remove(store.engine, "after_cursor_execute", fail_after_queueing)
    assert _deliveries(store) == []
    with store.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(IncidentRow)).scalar() == 0


def _one_alert(severity: str, step: int = 3, rule: str = "z_growth") -> Callable[[Any], list[NewAlert]]:
    return lambda _windows: [NewAlert(rule, severity, "attention_z", 2, step, 400.0, 50.0, "climbing")]


def test_a_webhook_waiting_for_critical_hears_of_the_escalation(store: SqlStore) -> None:
    client = make_client(store)
    r = client.post(
        "/api/v1/projects/default/webhooks",
        json={"url": "https://example.org/h/crit", "min_severity": "critical"},
        headers=AUTH,
    )
    assert r.status_code == 201
    run_id = int(str(create_run(client, "r1")["id"]))
    store.ingest(run_id, "batch-warning-1", [Point("attention_z", 3, 400.0, layer=2)], _one_alert("warning"))
    assert _deliveries(store) == []
    store.ingest(run_id, "batch-critical1", [Point("attention_z", 4, 900.0, layer=2)], _one_alert("critical", 4))
    assert [(e, s) for _w, _i, e, s in _deliveries(store)] == [("incident.escalated", "pending")]
    store.ingest(run_id, "batch-critical2", [Point("attention_z", 5, 990.0, layer=2)], _one_alert("critical", 5))
    assert len(_deliveries(store)) == 1


def test_retries_give_up_and_keep_the_last_error(store: SqlStore) -> None:
    dead = Receiver(fail_first=10**6, status=503)
    client = make_client(store)
    hook = client.post("/api/v1/projects/default/webhooks", json={"url": dead.url}, headers=AUTH).json()
    run_id = int(str(create_run(client, "r1")["id"]))
    store.ingest(run_id, "batch-critical1", [Point("loss", 3, math.nan)], _one_alert("critical"))
    deliverer = notify.Deliverer(store.webhook_outbox(), RetryPolicy(0.01, 0.02, 3600, 3), None, 5.0, 0.01)
    try:

        def given_up() -> bool:
            deliverer.run_once()
            return client.get(f"/api/v1/projects/default/webhooks/{hook['id']}", headers=AUTH).json()["failed"] == 1

        wait_for(given_up, "the delivery given up")
    finally:
        deliverer.stop()
        dead.close()
    assert len(dead.requests) == 3
    got = client.get(f"/api/v1/projects/default/webhooks/{hook['id']}", headers=AUTH).json()
    last = got["last_delivery"]
    assert (last["state"], last["attempts"], last["http_status"]) == ("failed", 3, 503)
    assert last["error"].startswith("gave up after 3 attempts: HTTP 503")
    assert SECRET not in json.dumps(got)


def test_two_deliverers_never_claim_the_same_delivery(store: SqlStore) -> None:
    client = make_client(store)
    for n in range(4):
        client.post("/api/v1/projects/default/webhooks", json={"url": f"https://example.org/h/{n:04d}"}, headers=AUTH)
    run_id = int(str(create_run(client, "r1")["id"]))
    for k in range(10):  # ten incidents (a new episode each) x four webhooks
        step = 3 + 2000 * k
        store.ingest(run_id, f"batch-{k:010d}", [Point("loss", step, math.nan)], _one_alert("critical", step))
    assert len(_deliveries(store)) == 40
    outboxes = [store.webhook_outbox(), store.webhook_outbox()]
    claimed: list[list[int]] = [[], []]
    go = threading.Barrier(2)

    def claim(k: int) -> None:
        go.wait()
        while batch := outboxes[k].claim(3, 600):
            claimed[k] += [c.id for c in batch]

    threads = [threading.Thread(target=claim, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for o in outboxes:
        o.close()
    assert sorted(claimed[0] + claimed[1]) == sorted(set(claimed[0]) | set(claimed[1]))
    assert len(claimed[0]) + len(claimed[1]) == 40


def test_validation_auth_and_the_secret_url(client: TestClient) -> None:
    path = "/api/v1/projects/default/webhooks"
    url = f"https://hooks.slack.com/services/{SECRET}"
    assert client.post(path, json={"url": url}).status_code == 401
    assert (
        client.post(path, json={"url": url}, headers={"Authorization": "Bearer wrong-token-0123456789"}).status_code
        == 403
    )
    listed = client.get(path)  # a read: open like every read when no read token is set (the URL masked)
    assert listed.status_code not in (401, 403) and SECRET not in listed.text
    bad = client.post(path, json={"url": "ftp://example.org/x"}, headers=AUTH)
    assert bad.status_code == 422
    assert bad.json()["detail"][0]["loc"] == ["body", "url"] and "http:// or https://" in bad.json()["message"]
    for wrong in ("hooks.slack.com/services/x", "https:///nohost", "https://exa mple.org/x", 42):
        r = client.post(path, json={"url": wrong}, headers=AUTH)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "url"], (wrong, r.text)
    fmt = client.post(path, json={"url": url, "format": "teams"}, headers=AUTH)
    assert fmt.status_code == 422 and fmt.json()["detail"][0]["loc"] == ["body", "format"]
    assert "slack" in fmt.json()["message"] and "generic" in fmt.json()["message"]
    sev = client.post(path, json={"url": url, "min_severity": "page"}, headers=AUTH)
    assert sev.status_code == 422 and sev.json()["detail"][0]["loc"] == ["body", "min_severity"]
    assert client.post("/api/v1/projects/bad%20name/webhooks", json={"url": url}, headers=AUTH).status_code == 422
    assert client.get("/api/v1/projects/nobody/webhooks", headers=AUTH).status_code == 404

    made = client.post(path, json={"url": url, "name": "#training"}, headers=AUTH)
    assert made.status_code == 201
    again = client.post(path, json={"url": url, "min_severity": "critical"}, headers=AUTH)
    assert again.status_code == 200 and again.json()["id"] == made.json()["id"]  # same URL: updated
    hook_id = made.json()["id"]
    null = client.patch(f"{path}/{hook_id}", json={"format": None}, headers=AUTH)
    assert null.status_code == 422 and null.json()["detail"][0]["loc"] == ["body", "format"]
    patched = client.patch(f"{path}/{hook_id}", json={"format": "generic"}, headers=AUTH)
    assert patched.status_code == 200 and patched.json()["format"] == "generic"
    answers = [made, again, patched, client.get(path, headers=AUTH), client.get(f"{path}/{hook_id}", headers=AUTH)]
    answers.append(client.delete(f"{path}/{hook_id}", headers=AUTH))
    for r in answers:
        assert r.status_code in (200, 201) and "sEcReT" not in r.text and "T0AAA" not in r.text, r.text
    shown = answers[-1].json()["url"]
    assert shown == "https://hooks.slack.com/...wxyz"
    assert client.get(path, headers=AUTH).json() == []
    assert client.get(f"{path}/{hook_id}", headers=AUTH).status_code == 404


def test_payloads_without_a_public_url_and_with_non_finite_values() -> None:
    from datetime import UTC, datetime

    from hyperwatch.monitor.store.incidents import Incident

    now = datetime.now(UTC)
    inc = Incident(
        7, 3, "run-<a>&b", "proj", "logit_ceiling", "service", "critical", "attention_lse_max", 10, 12, 2,
        math.inf, -math.inf, math.nan, [1], [(1, 2)], [10, 12], "passed the ceiling", now, now,
    )  # fmt: skip
    generic = notify.generic_payload("incident.opened", 5, inc, None)
    json.dumps(generic, allow_nan=False)  # no bare NaN / Infinity in the JSON
    assert generic["url"] is None and "HYPERWATCH_PUBLIC_URL" in generic["url_note"]
    i = generic["incident"]
    assert (i["first_value"], i["peak_value"], i["baseline"]) == ("Infinity", "-Infinity", "NaN")
    assert i["heads"] == [{"layer": 1, "head": 2}]
    slack = notify.slack_payload("incident.opened", inc, None)
    json.dumps(slack, allow_nan=False)
    assert "HYPERWATCH_PUBLIC_URL" in slack["blocks"][3]["text"]["text"]
    assert "run-&lt;a&gt;&amp;b" in slack["text"]  # Slack's control characters escaped
    assert notify.masked_url("https://user:pw@hooks.example.org:8443/a/b/c/SECRETxyz9") == (
        "https://hooks.example.org:8443/...xyz9"
    )


def test_deleting_a_run_deletes_its_queued_deliveries(store: SqlStore) -> None:
    client = make_client(store)
    client.post("/api/v1/projects/default/webhooks", json={"url": "https://example.org/h/gone"}, headers=AUTH)
    run_id = int(str(create_run(client, "r1")["id"]))
    store.ingest(run_id, "batch-critical1", [Point("loss", 3, math.nan)], _one_alert("critical"))
    assert len(_deliveries(store)) == 1
    store.delete_run(run_id)  # its incidents go, and their outbox rows with them (ON DELETE CASCADE)
    assert _deliveries(store) == []
    assert client.get("/api/v1/projects/default/webhooks", headers=AUTH).json()[0]["pending"] == 0
