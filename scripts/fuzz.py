"""Schemathesis over the OpenAPI schema of the real service, on SQLite and PostgreSQL.

For each database: a fresh database, ``hyperwatch serve`` on a free port with a write token, a
seed run/group/points, then ``st run --checks all`` with the write token for ``--max-examples`` per
operation and phase. Every exchange is recorded (HAR) and counted here, so the figures are the
service's own answers, not schemathesis' summary:

    fuzz sqlite: 20412 cases, 0 responses >= 500, 0 of them 503; failed checks: ...

Exit status 1 when any response is >= 500 (a 503 counts: the database is up throughout, so a 503
would be a client error reported as an outage). ``make fuzz`` runs the long version; the suite runs
a short one (tests/reliability/test_fuzz.py).

    python scripts/fuzz.py --db both --max-examples 400
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import create_engine, text

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.reliability.support import AUTH, WRITE_TOKEN, Service, upgrade  # noqa: E402

PG_ADMIN_URL = os.environ.get("HYPERWATCH_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


@dataclass
class FuzzResult:
    database: str
    cases: int = 0
    server_errors: int = 0  # responses >= 500
    unavailable: int = 0  # responses 503
    statuses: collections.Counter[int] = field(default_factory=collections.Counter)
    examples: list[str] = field(default_factory=list)  # a few requests that got >= 500
    failed_checks: str = ""
    exit_code: int = 0

    def line(self) -> str:
        common = ", ".join(f"{s}: {n}" for s, n in sorted(self.statuses.items()))
        return (
            f"fuzz {self.database}: {self.cases} cases, {self.server_errors} responses >= 500, "
            f"{self.unavailable} of them 503 (statuses {common}); schemathesis exit {self.exit_code}"
        )


def _post(url: str, path: str, body: object) -> int:
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST", headers=AUTH)
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=60) as resp:
        return int(resp.status)


def seed(url: str) -> None:
    """A run in a group with points, so that generated ids and names sometimes hit real rows."""
    _post(url, "/api/v1/runs", {"name": "seed", "group": "g", "depth": 2, "flops": 1e18, "lr": 1e-3, "tokens": 10**9})
    pts = [{"name": "attention_z", "layer": i % 2, "step": i, "value": 1.0} for i in range(20)]
    _post(url, "/api/v1/points", {"batch_id": "seed-batch-1", "run": "seed", "points": pts})


def count_har(path: Path, result: FuzzResult) -> None:
    har = json.loads(path.read_text(errors="replace"))
    for entry in har.get("log", {}).get("entries", []):
        status = int(entry.get("response", {}).get("status", 0))
        result.cases += 1
        result.statuses[status] += 1
        if status >= 500:
            result.server_errors += 1
            result.unavailable += status == 503
            if len(result.examples) < 5:
                req = entry.get("request", {})
                body = (req.get("postData") or {}).get("text", "")[:200]
                result.examples.append(f"{status} {req.get('method')} {req.get('url')} {body}")


_ACCESS = re.compile(r'"(?P<method>[A-Z]+) (?P<path>\S+) HTTP/1\.1" (?P<status>\d{3})')


def count_access_log(path: Path, result: FuzzResult) -> None:
    """The same counts from the service's access log (when the HAR is missing, e.g. a run cut short)."""
    for m in _ACCESS.finditer(path.read_text(errors="replace")):
        status = int(m["status"])
        result.cases += 1
        result.statuses[status] += 1
        if status >= 500:
            result.server_errors += 1
            result.unavailable += status == 503
            if len(result.examples) < 5:
                result.examples.append(f"{status} {m['method']} {m['path']}")


def fuzz(db_url: str, database: str, max_examples: int, workdir: Path, seed_value: int = 14) -> FuzzResult:
    """Serve ``db_url`` (migrated) and fuzz it; the service is killed afterwards."""
    result = FuzzResult(database)
    svc = Service(db_url, workdir / f"service-{database}.log")
    svc.start()
    try:
        seed(svc.url)
        har = workdir / f"fuzz-{database}.har"
        cmd = [
            str(Path(sys.executable).with_name("st")),
            "run",
            f"{svc.url}/openapi.json",
            "--checks",
            "all",
            "--header",
            f"Authorization: Bearer {WRITE_TOKEN}",
            "--max-examples",
            str(max_examples),
            "--seed",
            str(seed_value),
            "--continue-on-failure",
            "--workers",
            "2",
            "--request-timeout",
            "60",
            "--report",
            "har",
            "--report-har-path",
            str(har),
            "--no-color",
        ]
        proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=None)
        result.exit_code = proc.returncode
        (workdir / f"schemathesis-{database}.txt").write_text(proc.stdout + proc.stderr)
        lines = proc.stdout.strip().splitlines()
        result.failed_checks = "\n".join(line.strip() for line in lines if line.lstrip().startswith("❌"))[-3000:]
        try:
            count_har(har, result)
        except (OSError, ValueError):  # no HAR or a cut one: the service's own access log
            result.failed_checks += "\n" + proc.stdout[-3000:] + proc.stderr[-3000:]
            count_access_log(svc.log_path, result)
    finally:
        svc.kill()
    return result


def fresh_pg() -> tuple[str, str]:
    name = f"hw_fuzz_{uuid.uuid4().hex[:12]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name, name


def drop_pg(name: str) -> None:
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--db", choices=["sqlite", "postgresql", "both"], default="both")
    p.add_argument("--max-examples", type=int, default=400, help="per operation and phase (default 400)")
    p.add_argument("--seed", type=int, default=14, help="schemathesis seed (another seed, other cases)")
    p.add_argument("--keep", metavar="DIR", help="keep the HAR files and service logs in DIR")
    p.add_argument("--count-log", metavar="LOG", help="only count the access log of an earlier run's service")
    args = p.parse_args()
    if args.count_log:
        result = FuzzResult(Path(args.count_log).stem)
        count_access_log(Path(args.count_log), result)
        print(result.line())
        return 1 if result.server_errors else 0
    workdir = Path(args.keep or tempfile.mkdtemp(prefix="hw-fuzz-"))
    workdir.mkdir(parents=True, exist_ok=True)
    failed = False
    for database in ("sqlite", "postgresql") if args.db == "both" else (args.db,):
        t0 = time.monotonic()
        pg_name = None
        if database == "sqlite":
            url = f"sqlite:///{workdir}/fuzz.db"
        else:
            url, pg_name = fresh_pg()
        try:
            upgrade(url)
            result = fuzz(url, database, args.max_examples, workdir, args.seed)
        finally:
            if pg_name:
                drop_pg(pg_name)
        print(f"{result.line()} in {time.monotonic() - t0:.0f} s", flush=True)
        for example in result.examples:
            print("  >= 500:", example)
        if result.failed_checks:
            print("  schemathesis:", result.failed_checks.replace("\n", "\n  "))
        failed |= result.server_errors > 0 or result.cases == 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
