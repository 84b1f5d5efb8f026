"""Ctrl-C on a real training run: the service (a real ``hyperwatch serve`` process) shows it "interrupted".

Without this a run stopped by Ctrl-C stayed "running" forever. The trainer's KeyboardInterrupt
path closes the hooks with status "interrupted"; the process then exits the way Ctrl-C exits
(SIGINT re-raised: -2, or 130 from a shell), which is what sweeps and the demo read as "stopped by
the user" rather than "failed".
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from hyperwatch.monitor.processes.children import ServiceProcess, python_env
from hyperwatch.monitor.processes.lifetime import die_with_parent
from hyperwatch.trainer.sweep import INTERRUPTED_CODES


def test_sigint_marks_the_run_interrupted_in_the_service(tmp_path: Path, corpus_cache: Path) -> None:
    with ServiceProcess(f"sqlite:///{tmp_path / 'hw.db'}", log_path=tmp_path / "service.log") as svc:
        cmd = [
            sys.executable, "-m", "hyperwatch", "train",
            "--preset", "tiny", "--model.depth", "2", "--model.seq_len", "64",
            "--train.micro_batch", "4", "--train.batch_tokens", "512",
            "--train.tokens", "1024000",  # 2000 steps: still running when Ctrl-C comes
            "--train.eval_every", "0", "--train.progress", "false", "--train.threads", "1",
            "--train.out_dir", str(tmp_path / "run"),
            "--data.max_bytes", "300000", "--data.cache_dir", str(corpus_cache),
            "--log.every", "1", "--log.run", "ctrl-c", "--log.sink", svc.url,
        ]  # fmt: skip
        proc = subprocess.Popen(
            die_with_parent(cmd),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=python_env(keep_hyperwatch=False),
        )
        assert proc.stdout is not None
        lines = []
        try:
            for line in proc.stdout:  # wait until it trains and streams (a few logged steps)
                lines.append(line)
                if " progress ctrl-c step 3/2000 " in line:
                    break
            assert proc.poll() is None, "".join(lines[-30:])
            running = httpx.get(f"{svc.url}/api/v1/runs", timeout=10).json()
            assert [r["status"] for r in running if r["name"] == "ctrl-c"] == ["running"]
            proc.send_signal(signal.SIGINT)
            rest, _ = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        out = "".join(lines) + rest
        assert proc.returncode in INTERRUPTED_CODES, out[-3000:]
        assert "KeyboardInterrupt" in out
        deadline = time.monotonic() + 30
        while True:
            runs = {r["name"]: r for r in httpx.get(f"{svc.url}/api/v1/runs", timeout=10).json()}
            if runs["ctrl-c"]["status"] != "running" or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    run = runs["ctrl-c"]
    assert run["status"] == "interrupted", run
    assert not run["stale"]
    assert 3 <= run["tokens_seen"] < run["tokens"]  # it had streamed points, and stopped short of its budget
