"""Concurrency and load: 8 training processes into one service, then a burst from bench/load.py.

On SQLite and PostgreSQL: every point of every process is stored exactly once (one row per key,
and the stored batches' point counts add up to the points). The sustained figure (200 requests/s
of 1,000-point batches for 60 s) is ``bench/load.py --duration 60``; here a short burst checks the
same invariant under load, with no timing assertion.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.reliability.support import REPO, WRITE_TOKEN, Service, python_env, stored

PROCS, BATCHES, POINTS = 8, 150, 16


def test_eight_trainer_processes_at_once_every_point_once(service: Service, tmp_path: Path) -> None:
    env = python_env(HYPERWATCH_TOKEN=WRITE_TOKEN)
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.reliability.trainer_proc",
                service.url,
                str(tmp_path / f"spool{k}"),
                f"proc-{k}",
                "--batches",
                str(BATCHES),
                "--points",
                str(POINTS),
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in range(PROCS)
    ]
    for k, proc in enumerate(procs):
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"trainer {k}: {err[-2000:]}"
        assert json.loads(out.splitlines()[-1])["dropped"] == 0
    want = {("attention_z", j, s) for s in range(BATCHES) for j in range(POINTS)}
    for k in range(PROCS):
        got = stored(service.db_url, f"proc-{k}")
        assert got.keys == want, f"proc-{k}"
        assert got.points == got.ingested == BATCHES * POINTS, f"proc-{k}: a point was stored twice"
        # the hooks' ids (revision 0019): every batch claimed, in one row for the process's session
        assert got.batches == BATCHES and got.claim_rows == 1, f"proc-{k}: {got.batches} ids, {got.claim_rows} rows"


def test_load_burst_from_a_separate_process_every_point_once(pg_url: str) -> None:
    # pg_url: skips (or fails under CI) like the other PostgreSQL tests when no server answers.
    cmd = [
        sys.executable,
        str(REPO / "bench" / "load.py"),
        "--db",
        "both",
        "--rate",
        "10",
        "--duration",
        "2",
        "--points",
        "1000",
        "--workers",
        "4",
        "--json",
    ]
    done = subprocess.run(cmd, cwd=REPO, env=python_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r["db"] for r in lines] == ["sqlite", "postgresql"]
    for r in lines:
        assert r["errors"] == 0 and r["ok"] > 0, r
        assert r["rows"] == r["distinct"] == r["ingested"] == r["points_acked"] == 1000 * r["ok"], r
        assert r["p99_ms"] >= r["p50_ms"] > 0
