"""A small real HTTP service with the HyperWatch run/points contract, for the sink tests.

Run as ``python fake_service.py PORT DB_PATH [--token T] [--json-only]``. Batches come as JSON or
as the columns body of :mod:`hooks.columns` (counted as ``columns_posts``), which ``--json-only``
answers with 415, as a service that does not read it would. It stores
in SQLite, so a SIGKILLed instance restarted on the same file keeps what it acknowledged.
Points are idempotent on batch_id only (stricter than the real service, which also dedups on
(run, name, layer, step)), so a duplicate row means the client resent under a new key;
``deliveries`` counts every point received, duplicates included, so tests can see retries.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from hyperwatch.hooks.columns import COLUMNS_MEDIA_TYPE, decode_body

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (id INTEGER PRIMARY KEY, name TEXT UNIQUE, body TEXT, status TEXT);
CREATE TABLE IF NOT EXISTS batches (batch_id TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS points (run TEXT, name TEXT, layer INTEGER, step INTEGER, value TEXT);
CREATE TABLE IF NOT EXISTS stats (key TEXT PRIMARY KEY, n INTEGER);
"""


class Handler(BaseHTTPRequestHandler):
    db: sqlite3.Connection
    token: str | None = None
    json_only = False

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _reply(self, code: int, body: Any) -> None:
        raw = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _body(self) -> Any:
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        if self.headers.get("Content-Type") == COLUMNS_MEDIA_TYPE:
            if self.json_only:
                self._reply(415, {"detail": "send JSON"})
                return None
            self.db.execute("INSERT INTO stats VALUES ('columns_posts', 1) ON CONFLICT(key) DO UPDATE SET n = n + 1")
            batch_id, run, columns = decode_body(raw)
            return {"batch_id": batch_id, "run": run, "points": [p.to_json() for p in columns.points()]}
        return json.loads(raw) if raw else None

    def _authorized(self) -> bool:
        if self.token is None or self.headers.get("Authorization") == f"Bearer {self.token}":
            return True
        self._reply(401, {"detail": "bad token"})
        return False

    def do_GET(self) -> None:
        if self.path == "/dump":
            db = self.db
            points = [list(r) for r in db.execute("SELECT run, name, layer, step, value FROM points")]
            runs = [list(r) for r in db.execute("SELECT id, name, body, status FROM runs")]
            stats = dict(db.execute("SELECT key, n FROM stats").fetchall())
            self._reply(200, {"points": points, "runs": runs, "stats": stats})
        else:
            self._reply(404, {"detail": "not found"})

    def do_POST(self) -> None:
        if not self._authorized():
            return
        body = self._body()
        if body is None and self.path == "/api/v1/points":
            return  # answered already (415)
        db = self.db
        if self.path == "/api/v1/runs":
            db.execute(
                "INSERT INTO runs (name, body, status) VALUES (?, ?, ?) "
                "ON CONFLICT(name) DO UPDATE SET body = excluded.body",
                (body["name"], json.dumps(body), body.get("status")),
            )
            db.commit()
            (run_id,) = db.execute("SELECT id FROM runs WHERE name = ?", (body["name"],)).fetchone()
            self._reply(201, {"id": run_id, "name": body["name"]})
        elif self.path == "/api/v1/points":
            if self.headers.get("Idempotency-Key") != body["batch_id"]:
                self._reply(400, {"detail": "Idempotency-Key must equal batch_id"})
                return
            if db.execute("SELECT 1 FROM runs WHERE name = ?", (body["run"],)).fetchone() is None:
                self._reply(404, {"detail": f"unknown run {body['run']}"})
                return
            db.execute(
                "INSERT INTO stats VALUES ('deliveries', ?) ON CONFLICT(key) DO UPDATE SET n = n + ?",
                (len(body["points"]), len(body["points"])),
            )
            if db.execute("SELECT 1 FROM batches WHERE batch_id = ?", (body["batch_id"],)).fetchone():
                db.commit()
                self._reply(200, {"accepted": 0, "duplicate": True})
                return
            if any(p["name"] == "user.poison" for p in body["points"]):
                db.commit()
                self._reply(422, {"detail": "poison point refused"})
                return
            db.execute("INSERT INTO batches VALUES (?)", (body["batch_id"],))
            for p in body["points"]:
                db.execute(
                    "INSERT INTO points VALUES (?, ?, ?, ?, ?)",
                    (
                        body["run"],
                        p["name"],
                        -1 if p["layer"] is None else p["layer"],
                        p["step"],
                        json.dumps(p["value"]),
                    ),
                )
            db.commit()
            self._reply(201, {"accepted": len(body["points"]), "duplicate": False})
        else:
            self._reply(404, {"detail": "not found"})

    def do_PATCH(self) -> None:
        if not self._authorized():
            return
        body = self._body()
        run_id = self.path.rsplit("/", 1)[-1]
        cur = self.db.execute("UPDATE runs SET status = COALESCE(?, status) WHERE id = ?", (body.get("status"), run_id))
        self.db.commit()
        self._reply(200 if cur.rowcount else 404, {"id": run_id, **body})


def main() -> None:
    port, path = int(sys.argv[1]), sys.argv[2]
    token = sys.argv[sys.argv.index("--token") + 1] if "--token" in sys.argv else None
    db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    db.executescript(SCHEMA)
    db.isolation_level = ""
    Handler.db = db
    Handler.token = token
    Handler.json_only = "--json-only" in sys.argv
    server = HTTPServer(("127.0.0.1", port), Handler)  # one thread: one SQLite connection
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
