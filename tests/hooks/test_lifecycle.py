"""A run's life as a W&B user expects it: one token name, a visible run URL, an honest final status
when the process ends without ``mon.close()``, and no delivered spool folder left behind."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from hyperwatch import hooks
from hyperwatch.hooks import upload
from hyperwatch.hooks.schema import Batch, Point
from hyperwatch.hooks.sinks import token as token_module
from hyperwatch.hooks.sinks.folder import pending_files
from tests.hooks.support import FakeService, free_port, wait_until

TOKEN = "lifecycle-secret-0123456789"


def status_of(svc: FakeService, run: str) -> str | None:
    return next((status for _id, name, _body, status in svc.dump()["runs"] if name == run), None)


def stored_steps(svc: FakeService, run: str) -> list[int]:
    return sorted(step for r, name, _layer, step, _v in svc.dump()["points"] if r == run and name == "loss")


def tiny_attach(url: str, run: str, spool: Path, close_timeout: float) -> hooks.Monitor:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    mon = hooks.attach(model, run=run, sink=url, spool=spool, every=1, attention="0", close_timeout=close_timeout)
    for step in range(3):
        model(torch.randn(2, 4)).sum().backward()
        mon.step(step, loss=float(step))
    return mon


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[FakeService]:
    svc = FakeService(tmp_path / "secured.sqlite", token=TOKEN)
    svc.start()
    yield svc
    svc.kill()


@pytest.fixture
def no_token_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv("HYPERWATCH_WRITE_TOKEN", raising=False)
    monkeypatch.delenv("HYPERWATCH_TOKEN", raising=False)
    monkeypatch.setattr(token_module, "_warned", False)
    return monkeypatch


# -- (1) the token: the service's name works in the training process --
@pytest.mark.parametrize("variable", ["HYPERWATCH_WRITE_TOKEN", "HYPERWATCH_TOKEN"])
def test_the_training_process_sends_the_token_the_service_reads(
    secured: FakeService, tmp_path: Path, no_token_env: pytest.MonkeyPatch, variable: str
) -> None:
    no_token_env.setenv(variable, TOKEN)  # the service's variable, or the hooks' older alias
    mon = tiny_attach(secured.url, "tok-" + variable.lower(), tmp_path / "spool", close_timeout=20)
    mon.close()
    assert status_of(secured, "tok-" + variable.lower()) == "finished"
    assert stored_steps(secured, "tok-" + variable.lower()) == [0, 1, 2]


def test_both_token_variables_set_and_different_the_services_name_wins_and_says_so(
    secured: FakeService, tmp_path: Path, no_token_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    no_token_env.setenv("HYPERWATCH_WRITE_TOKEN", TOKEN)
    no_token_env.setenv("HYPERWATCH_TOKEN", "an-old-token-that-is-wrong")
    caplog.set_level(logging.WARNING, logger="hyperwatch.hooks")
    mon = tiny_attach(secured.url, "tok-both", tmp_path / "spool", close_timeout=20)
    mon.close()
    assert status_of(secured, "tok-both") == "finished"
    lines = [r.getMessage() for r in caplog.records if "both set and differ" in r.getMessage()]
    assert len(lines) == 1 and "sending HYPERWATCH_WRITE_TOKEN" in lines[0], lines


def test_a_refused_token_names_the_variable_the_training_process_must_set(
    secured: FakeService, tmp_path: Path, no_token_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="hyperwatch.hooks")
    mon = tiny_attach(secured.url, "tok-none", tmp_path / "spool", close_timeout=1)
    mon.close()  # the default sink: no token anywhere
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR and "HTTP 401" in r.getMessage()]
    assert len(errors) == 1, errors
    assert "Set HYPERWATCH_WRITE_TOKEN in the training process" in errors[0] and "no token was sent" in errors[0]
    assert status_of(secured, "tok-none") is None and pending_files(tmp_path / "spool" / "tok-none")
    with_token = hooks.HttpSink(secured.url, token=TOKEN, spool=tmp_path / "other")
    assert with_token.replay_command().endswith("# with HYPERWATCH_WRITE_TOKEN set (or --token)")

    no_token_env.setenv("HYPERWATCH_WRITE_TOKEN", TOKEN)  # what the message says: upload now delivers it
    args = argparse.Namespace(
        dir=tmp_path / "spool", server=secured.url, token=None, max_points=100, retries=2, timeout=10.0
    )
    assert upload.run(args) == 0
    assert stored_steps(secured, "tok-none") == [0, 1, 2] and status_of(secured, "tok-none") == "finished"


# -- (2) a process that ends without mon.close(); (5a) the run URL on stderr --
TRAINER = textwrap.dedent(
    """
    import sys, time, torch
    from hyperwatch import hooks
    url, spool, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    mon = hooks.attach(model, run="exit-" + mode, sink=url, spool=spool, every=1, attention="0",
                       close_timeout=float(sys.argv[4]))
    for step in range(3):
        model(torch.randn(2, 4)).sum().backward()
        mon.step(step, loss=float(step))
    if mode != "down":
        assert mon.flush(30)  # the run exists and is "running" on the service
    print("ready", flush=True)
    sys.stdin.readline()  # the test looked at the run while the process lives
    if mode == "raise":
        raise RuntimeError("boom in the training loop")
    if mode == "exit3":
        sys.exit(3)
    if mode == "sigint":
        while True:
            time.sleep(0.05)
    # "normal", "down": the script just ends, mon.close() never called
    """
)


def start_trainer(url: str, spool: Path, mode: str, close_timeout: float = 10.0) -> subprocess.Popen[str]:
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(Path.cwd()), "HOME": str(spool.parent)}
    return subprocess.Popen(
        [sys.executable, "-c", TRAINER, url, str(spool), mode, str(close_timeout)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


@pytest.mark.parametrize(
    ("mode", "status", "returncode"),
    [
        ("normal", "finished", 0),
        ("raise", "failed", 1),
        ("exit3", "failed", 3),
        ("sigint", "interrupted", -signal.SIGINT),
    ],
)
def test_a_process_that_ends_without_close_marks_its_run_as_it_ended(
    service: FakeService, tmp_path: Path, mode: str, status: str, returncode: int
) -> None:
    proc = start_trainer(service.url, tmp_path / "spool", mode)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready", proc.communicate(timeout=60)
    assert status_of(service, "exit-" + mode) == "running"
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    if mode == "sigint":
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)  # Ctrl-C
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == returncode, err
    assert status_of(service, "exit-" + mode) == status, err
    assert stored_steps(service, "exit-" + mode) == [0, 1, 2]
    assert not (tmp_path / "spool" / ("exit-" + mode)).exists()  # delivered: the spool folder is gone
    if mode == "raise":
        assert "RuntimeError: boom in the training loop" in err  # the user's traceback is still printed
    # (5a) the run's page, on stderr without any logging set up, once
    view = [line for line in err.splitlines() if line.startswith("hyperwatch: view run")]
    assert view == [f"hyperwatch: view run 'exit-{mode}' at {service.url}/runs/1"], err


def test_the_exit_close_is_bounded_when_the_service_is_down(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    proc = start_trainer(f"http://127.0.0.1:{free_port()}", spool, "down", close_timeout=1.0)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready", proc.communicate(timeout=60)
    # close_timeout 1 s: the exit does not hang on the network (a hang would retry forever: the 60 s
    # guard below fails it; how long the exit takes is not asserted here)
    _out, err = proc.communicate("go\n", timeout=60)
    assert proc.returncode == 0, err
    assert '"finished"' in (spool / "exit-down" / "status.json").read_text()  # spooled for a replay
    assert len(pending_files(spool / "exit-down")) == 3
    assert "hyperwatch upload" in err  # the replay command, logged at WARNING


# -- (5c) hyperwatch upload removes what it delivered --
def test_upload_removes_delivered_spool_folders_and_keeps_rejected_batches(
    service: FakeService, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    down = hooks.HttpSink(f"http://127.0.0.1:{free_port()}", spool=spool, backoff=(0.05, 0.1), close_timeout=0.5)
    down.start(hooks.RunInfo("offline-run", fields={"status": "running"}))
    for step in range(4):
        down.write(Batch(run="offline-run", points=[Point("loss", step, 1.0)]))
    down.finish("finished")
    down.close()  # the service was down: everything stays in the spool
    assert len(pending_files(spool / "offline-run")) == 4

    live = hooks.HttpSink(service.url, spool=spool, backoff=(0.05, 0.1), close_timeout=20)
    live.start(hooks.RunInfo("poisoned-run", fields={"status": "running"}))
    live.write(Batch(run="poisoned-run", points=[Point("loss", 0, 1.0)]))
    live.write(Batch(run="poisoned-run", points=[Point("user.poison", 1, 1.0)]))
    live.finish("finished")
    live.close()
    rejected = list((spool / "poisoned-run" / "rejected").iterdir())
    assert len(rejected) == 1

    args = argparse.Namespace(dir=spool, server=service.url, token=None, max_points=100, retries=2, timeout=10.0)
    assert upload.run(args) == 0
    assert stored_steps(service, "offline-run") == [0, 1, 2, 3] and status_of(service, "offline-run") == "finished"
    assert not (spool / "offline-run").exists()  # every batch and the status acknowledged: removed
    assert [p.read_text() for p in (spool / "poisoned-run" / "rejected").iterdir()] == [
        p.read_text() for p in rejected
    ]  # the refused batch stays, for a person to look at
    assert upload.run(args) == 0  # a second replay delivers nothing new and keeps the rejected batch
    assert (spool / "poisoned-run" / "rejected").is_dir()
    assert wait_until(lambda: stored_steps(service, "offline-run") == [0, 1, 2, 3])
