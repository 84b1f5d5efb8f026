"""The training process dies mid-run: its spool is replayed on the next start or by ``hyperwatch upload``.

Nothing is duplicated: the database holds one row per key and the stored batches' point counts
add up to exactly the points (a group resent after the crash carries its original key).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hyperwatch.hooks.schema import Batch, Point
from hyperwatch.hooks.sinks import HttpSink, RunInfo, client
from hyperwatch.hooks.sinks.folder import INFLIGHT_FILE, merge, pending_files, write_inflight
from tests.reliability.support import REPO, WRITE_TOKEN, Service, free_port, python_env, stored


def trainer(url: str, spool: Path, run: str, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "tests.reliability.trainer_proc", url, str(spool), run, *extra]
    env = python_env(HYPERWATCH_TOKEN=WRITE_TOKEN)
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)


def upload(url: str, spool: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "hyperwatch", "upload", str(spool), "--server", url, "--token", WRITE_TOKEN]
    return subprocess.run(cmd, cwd=REPO, env=python_env(), capture_output=True, text=True, timeout=240)


def expected_keys(batches: int, points: int, first: int = 0) -> set[tuple[str, int, int]]:
    return {("attention_z", j, s) for s in range(first, first + batches) for j in range(points)}


@pytest.mark.parametrize("replay", ["next_start", "upload"])
def test_trainer_sigkilled_while_sending_then_replayed(service: Service, tmp_path: Path, replay: str) -> None:
    spool = tmp_path / "spool"
    # 400 batches spooled, SIGKILL once 50 were acknowledged: the sender is mid-spool, maybe mid-request.
    crashed = trainer(
        service.url, spool, "crash-1", "--batches", "400", "--points", "8", "--kill-after-delivered", "50"
    )
    assert crashed.returncode == -9, crashed.stderr
    left = pending_files(spool / "crash-1")
    assert 0 < len(left) < 400
    if replay == "next_start":
        done = trainer(service.url, spool, "crash-1", "--batches", "0")
        assert done.returncode == 0, done.stderr
    else:
        done = upload(service.url, spool)
        assert done.returncode == 0 and "crash-1:" in done.stdout, done.stdout + done.stderr
    got = stored(service.db_url, "crash-1")
    assert got.keys == expected_keys(400, 8)
    assert got.points == got.ingested == 400 * 8, "a point was stored or ingested twice"
    assert pending_files(spool / "crash-1") == [] and not (spool / "crash-1" / INFLIGHT_FILE).exists()


def spool_with_inflight(url: str, spool: Path, run: str, n: int) -> tuple[Path, list[Path], Batch]:
    """A spool as a sender leaves it when killed right after the service stored its group."""
    sink = HttpSink(f"http://127.0.0.1:{free_port()}", spool=spool, close_timeout=0.1)  # nothing listens
    sink.start(RunInfo(run))
    for step in range(n):
        sink.write(Batch(run, [Point("loss", step, float(step)), Point("lr", step, 1e-3)]))
    sink.close()
    folder = spool / run
    files = pending_files(folder)[: n // 2]
    group = merge([Batch.from_json(json.loads(p.read_text())) for p in files])
    write_inflight(folder, files)
    assert client.request("POST", f"{url}/api/v1/runs", {"name": run}, WRITE_TOKEN).status in (200, 201)
    resp = client.request("POST", f"{url}/api/v1/points", group.to_json(), WRITE_TOKEN, idempotency_key=group.batch_id)
    assert resp.status == 201  # stored; the "crashed" sender never saw this answer
    return folder, files, group


@pytest.mark.parametrize("replay", ["next_start", "upload"])
def test_crash_between_acknowledgement_and_deletion_duplicates_nothing(
    service: Service, tmp_path: Path, replay: str
) -> None:
    folder, _files, _group = spool_with_inflight(service.url, tmp_path / "spool", "ack-1", 20)
    if replay == "next_start":
        sink = HttpSink(service.url, token=WRITE_TOKEN, spool=tmp_path / "spool", backoff=(0.05, 0.2))
        sink.start(RunInfo("ack-1", resume=True))  # the crashed trainer restarts and resumes its run
        assert sink.flush(60)
        sink.close()
    else:
        done = upload(service.url, tmp_path / "spool")
        assert done.returncode == 0, done.stdout + done.stderr
    got = stored(service.db_url, "ack-1")
    assert got.points == got.ingested == 40 and got.batches >= 2
    assert pending_files(folder) == [] and not (folder / INFLIGHT_FILE).exists()


def test_crash_during_deletion_is_recognised_as_acknowledged(service: Service, tmp_path: Path) -> None:
    folder, files, _group = spool_with_inflight(service.url, tmp_path / "spool", "del-1", 20)
    files[0].unlink()  # the sender had begun deleting the acknowledged files
    done = upload(service.url, tmp_path / "spool")
    assert done.returncode == 0, done.stdout + done.stderr
    got = stored(service.db_url, "del-1")
    assert got.points == got.ingested == 40  # the rest of the group was not resent
    assert pending_files(folder) == [] and not (folder / INFLIGHT_FILE).exists()
