"""Sinks: JSONL, fan-out, and the HTTP sink against a real local service that dies and returns."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from hyperwatch import hooks
from hyperwatch.hooks import upload
from hyperwatch.hooks.schema import Batch, Point
from hyperwatch.hooks.sinks.folder import iter_jsonl, pending_files
from tests.hooks.support import FakeService, hf_model, wait_until


def batch(run: str, step: int, value: float = 1.0, name: str = "loss") -> Batch:
    return Batch(run=run, points=[Point(name, step, value, tokens=step * 10)])


def test_jsonl_sink_roundtrips_nonfinite_values(tmp_path: Path) -> None:
    model = hf_model("llama")
    mon = hooks.attach(model, run="offline-1", sink=str(tmp_path), every=1, config={"lr": 3e-3})
    for step, loss in enumerate([2.0, math.nan, math.inf]):
        mon.step(step, loss=torch.tensor(loss), lr=-math.inf if step == 2 else 0.1)
    mon.close()
    folder = tmp_path / "offline-1"
    meta = json.loads((folder / "run.json").read_text())
    assert meta["status"] == "finished" and meta["config"]["lr"] == 3e-3
    assert meta["config"]["_hyperwatch"]["hooks_adapter"] == "hf"
    raw = (folder / "batches.jsonl").read_text()
    assert '"NaN"' in raw and '"Infinity"' in raw and '"-Infinity"' in raw
    points = {(p.name, p.step): p.value for b in iter_jsonl(folder / "batches.jsonl") for p in b.points}
    assert points[("loss", 0)] == 2.0 and math.isnan(points[("loss", 1)]) and points[("loss", 2)] == math.inf
    assert points[("lr", 2)] == -math.inf


def test_a_failing_sink_never_stops_training_or_the_other_sinks() -> None:
    class Broken(hooks.Sink):
        def write(self, batch: Batch) -> None:
            raise OSError("disk full")

    good = hooks.MemorySink()
    model = hf_model("llama")
    mon = hooks.attach(model, run="f", sink=[Broken(), good], every=1)
    for step in range(3):
        mon.step(step, loss=1.0)
    mon.close()
    assert sorted(good.values("loss")) == [0, 1, 2]


def stored(svc: FakeService, run: str) -> list[tuple[str, int, int]]:
    return [(n, layer, step) for r, n, layer, step, _ in svc.dump()["points"] if r == run]


def test_service_killed_and_restarted_mid_run_every_point_arrives_exactly_once(
    service: FakeService, tmp_path: Path
) -> None:
    model = hf_model("llama")
    sink = hooks.HttpSink(service.url, spool=tmp_path / "spool", backoff=(0.05, 0.2), close_timeout=60)
    mon = hooks.attach(model, run="kill-1", sink=sink, every=1, config={"depth": 2}, depth=2)
    expected: set[tuple[str, int, int]] = set()

    def train(steps: range) -> None:
        for step in steps:
            mon.step(step, loss=float(step), lr=0.01, tokens=step * 24)
            expected.update({("loss", -1, step), ("lr", -1, step), ("tokens", -1, step), ("host_rss", -1, step)})

    train(range(0, 5))
    assert wait_until(lambda: len(stored(service, "kill-1")) == len(expected))
    service.kill()  # SIGKILL: the service dies without warning
    train(range(5, 12))  # training goes on; the sink spools and retries
    assert wait_until(lambda: len(pending_files(tmp_path / "spool" / "kill-1")) > 0)
    service.start()  # same port, same database file
    train(range(12, 15))
    mon.close()
    got = stored(service, "kill-1")
    assert len(got) == len(set(got)), "a point was stored twice"
    assert set(got) == expected
    assert pending_files(tmp_path / "spool" / "kill-1") == []
    runs = service.dump()["runs"]
    assert [r[1] for r in runs] == ["kill-1"] and runs[0][3] == "finished"
    assert json.loads(runs[0][2])["depth"] == 2


def test_a_service_that_forgot_the_run_gets_it_again(tmp_path: Path) -> None:
    svc = FakeService(tmp_path / "a.sqlite")
    svc.start()
    try:
        sink = hooks.HttpSink(svc.url, spool=tmp_path / "spool", backoff=(0.05, 0.2))
        sink.start(hooks.RunInfo("forget-1"))
        sink.write(batch("forget-1", 0))
        assert sink.flush(30)
        svc.kill()
        svc.db = tmp_path / "b.sqlite"  # a fresh database: the run is unknown -> 404
        svc.start()
        sink.write(batch("forget-1", 1))
        sink.finish("failed")
        assert sink.flush(30)
        sink.close()
        dump = svc.dump()
        assert [p[3] for p in dump["points"]] == [1] and dump["runs"][0][3] == "failed"
    finally:
        svc.kill()


def test_a_refused_batch_is_kept_aside_and_the_others_delivered(service: FakeService, tmp_path: Path) -> None:
    sink = hooks.HttpSink(service.url, spool=tmp_path / "spool", backoff=(0.05, 0.2))
    sink.start(hooks.RunInfo("poison-1"))
    for step in range(3):
        sink.write(batch("poison-1", step, name="user.poison" if step == 1 else "loss"))
    assert sink.flush(30)
    sink.close()
    assert sorted(s for _, s in [(n, st) for n, _, st in stored(service, "poison-1")]) == [0, 2]
    rejected = list((tmp_path / "spool" / "poison-1" / "rejected").iterdir())
    assert len(rejected) == 1 and "user.poison" in rejected[0].read_text()


CRASHING_TRAINER = textwrap.dedent(
    """
    import os, sys, torch, hooks
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    mon = hooks.attach(model, run="crash-1", sink=sys.argv[1], spool=sys.argv[2], every=1,
                       attention="0")
    for step in range(6):
        model(torch.randn(2, 4)).sum().backward()
        mon.step(step, loss=float(step))
    from hyperwatch.hooks.sinks.folder import pending_files
    import pathlib, time
    while len(pending_files(pathlib.Path(sys.argv[2]) / "crash-1")) < 6:
        time.sleep(0.05)  # every batch is in the spool (the service is down)...
    os._exit(1)           # ...and the process dies without closing anything
    """
)


def test_upload_replays_the_spool_of_a_crashed_process_exactly_once(tmp_path: Path) -> None:
    svc = FakeService(tmp_path / "s.sqlite", token="secret")
    spool = tmp_path / "spool"
    proc = subprocess.run(
        [sys.executable, "-c", CRASHING_TRAINER, svc.url, str(spool)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"HYPERWATCH_TOKEN": "secret", "PATH": "", "PYTHONPATH": str(Path.cwd())},
    )
    assert proc.returncode == 1, proc.stderr
    left = pending_files(spool / "crash-1")
    assert len(left) == 6
    svc.start()
    try:
        args = argparse.Namespace(dir=spool, server=svc.url, token=None, max_points=3, retries=2, timeout=10.0)
        assert upload.run(args) == 1  # no token: refused, nothing deleted
        assert len(pending_files(spool / "crash-1")) == 6
        args.token = "secret"
        assert upload.run(args) == 0
        got = stored(svc, "crash-1")
        assert sorted(s for n, _, s in got if n == "loss") == list(range(6))
        assert len(got) == len(set(got))
        assert pending_files(spool / "crash-1") == []
        assert upload.run(args) == 0  # nothing left: a second replay stores nothing new
        assert len(stored(svc, "crash-1")) == len(got)
    finally:
        svc.kill()


def test_upload_of_an_offline_folder_is_idempotent(tmp_path: Path, service: FakeService) -> None:
    sink = hooks.JsonlSink(tmp_path / "offline")
    sink.start(hooks.RunInfo("off-1", fields={"status": "running"}))
    for step in range(5):
        sink.write(batch("off-1", step))
    sink.finish("finished")
    sink.close()
    with open(tmp_path / "offline" / "off-1" / "batches.jsonl", "a") as f:
        f.write('{"batch_id": "cut-short-by-a-cra')  # a crash mid-line
    args = argparse.Namespace(
        dir=tmp_path / "offline", server=service.url, token=None, max_points=2, retries=2, timeout=10.0
    )
    assert upload.run(args) == 0
    assert upload.run(args) == 0  # same merged keys: stored once
    got = stored(service, "off-1")
    assert sorted(s for _, _, s in got) == [0, 1, 2, 3, 4]
    assert service.dump()["runs"][0][3] == "finished"
    parser = upload.build_parser("hyperwatch upload")
    assert upload.run(parser.parse_args([str(tmp_path / "nope"), "--server", service.url])) == 2
    assert upload.run(parser.parse_args([str(tmp_path), "--server", "ftp://x"])) == 2


def test_import_hooks_pulls_in_only_torch_numpy_and_the_standard_library() -> None:
    """Whatever torch and numpy import is theirs; importing hooks on top may add only the stdlib."""
    code = textwrap.dedent(
        """
        import sys
        import numpy, torch, torch.distributed, torch.overrides, torch.utils.hooks
        before = set(sys.modules)
        import hyperwatch.hooks, hyperwatch.hooks.upload
        new = {m.split(".")[0] for m in set(sys.modules) - before}
        print(",".join(sorted(new - set(sys.stdlib_module_names) - {"hyperwatch"})))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "", f"import hooks also imported: {out.stdout.strip()}"


def test_the_sink_sends_columns_to_a_service_that_reads_them_and_json_to_one_that_does_not(tmp_path: Path) -> None:
    """Issue 16: the binary columns body by default; a 415 (or an older service's 422) falls back to
    JSON for the same batch under the same key, and for the rest of the run; nothing lost or doubled."""
    sent = [Point("loss", 0, math.nan), Point("attention_z", 0, -math.inf, layer=3, tokens=7), Point("loss", 1, -0.0)]
    for json_only in (False, True):
        svc = FakeService(tmp_path / f"s{json_only}.sqlite", json_only=json_only)
        svc.start()
        try:
            sink = hooks.HttpSink(svc.url, spool=tmp_path / f"spool{json_only}", backoff=(0.05, 0.2))
            sink.start(hooks.RunInfo("cols-1"))
            sink.write(Batch("cols-1", sent[:2]))
            assert sink.flush(30)
            sink.write(Batch("cols-1", sent[2:]))
            assert sink.flush(30)
            sink.close()
            dump = svc.dump()
            got = sorted((n, layer, step, value) for _, n, layer, step, value in dump["points"])
            want = sorted(
                (p.name, -1 if p.layer is None else p.layer, p.step, json.dumps(p.to_json()["value"])) for p in sent
            )
            assert got == want
            assert dump["stats"].get("columns_posts", 0) == (0 if json_only else 2)
            assert sink.columns_body is not json_only
        finally:
            svc.kill()
