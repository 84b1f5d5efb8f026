"""Ordinary mistakes of a new user get a message that names the fix, and never lose data."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from hyperwatch import hooks
from hyperwatch.hooks.sinks.http import HttpSink
from tests.hooks.support import FakeService, free_port

REPO = Path(__file__).resolve().parents[2]


def tiny() -> nn.Module:
    torch.manual_seed(0)
    return nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), 2, enable_nested_tensor=False)


def one_step(mon: hooks.Monitor, model: nn.Module, step: int = 0, zero_first: bool = False) -> None:
    model(torch.randn(2, 4, 16)).square().mean().backward()
    if zero_first:
        model.zero_grad(set_to_none=True)  # the mistake: gradients gone before mon.step
    mon.step(step, loss=1.0)
    model.zero_grad(set_to_none=True)


@pytest.mark.parametrize("address", ["localhost:8000", "127.0.0.1:8000", "monitor.example.org:443/x"])
def test_a_service_address_without_scheme_is_refused_with_the_url_it_meant(
    address: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(hooks.SinkError, match=f"did you mean http://{address}\\?"):
        hooks.attach(tiny(), run="r", sink=address)
    assert list(tmp_path.iterdir()) == []  # no folder named after the address


def test_folders_stay_folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "host:9000").mkdir()  # it exists: the user means it
    for sink in ("host:9000", "./localhost:8000", Path("localhost:8001"), "runs/offline"):
        with hooks.attach(tiny(), run="r", sink=sink) as mon:
            one_step(mon, mon.model)
        assert (tmp_path / str(sink) / "r" / "batches.jsonl").is_file(), sink
    with pytest.raises(hooks.SinkError, match="ftp:// scheme is not supported"):
        hooks.make_sink("ftp://localhost:8000")


def test_api_path_in_the_url_says_give_the_base_url_and_close_is_bounded_then_replayable(
    service: FakeService, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The real local HTTP server answers 404 for /api/v1/api/v1/runs, as the service does."""
    caplog.set_level(logging.WARNING, logger="hyperwatch")
    model = tiny()
    mon = hooks.attach(
        model, run="wrong-url", sink=service.url + "/api/v1", spool=tmp_path / "spool", close_timeout=1.0, every=1
    )
    for step in range(3):
        one_step(mon, model, step)
    started = time.monotonic()
    mon.close()
    took = time.monotonic() - started
    assert took < 1.0 + 10.0, f"close() took {took:.1f} s"  # bounded (it blocked ~75 s before)
    text = caplog.text
    assert "answered 404 Not Found" in text
    assert f"Give the service's base URL (the sink adds /api/v1 itself), e.g. sink='{service.url}'" in text
    folder = tmp_path / "spool" / "wrong-url"
    command = f"hyperwatch upload {folder} --server {service.url}"
    assert command in text  # the exact replay command, with the base URL
    assert list((folder / "pending").glob("*.json")), "the spool holds the undelivered batches"
    assert service.dump()["runs"] == []

    # Running that very command delivers everything.
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "hyperwatch", *command.split()[1:]], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    dump = service.dump()
    assert [r[1] for r in dump["runs"]] == ["wrong-url"] and dump["runs"][0][3] == "finished"
    assert {p[3] for p in dump["points"] if p[1] == "loss"} == {0, 1, 2}


def test_close_timeout_env_var_and_bad_values(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HYPERWATCH_CLOSE_TIMEOUT", "0.3")
    sink = HttpSink(f"http://127.0.0.1:{free_port()}", spool=tmp_path)  # nothing listens
    assert sink.close_timeout == 0.3
    monkeypatch.setenv("HYPERWATCH_CLOSE_TIMEOUT", "soon")
    with pytest.raises(hooks.SinkError, match="HYPERWATCH_CLOSE_TIMEOUT='soon': must be a finite number of seconds"):
        HttpSink("http://127.0.0.1:1", spool=tmp_path)
    monkeypatch.delenv("HYPERWATCH_CLOSE_TIMEOUT")
    assert HttpSink("http://127.0.0.1:1", spool=tmp_path).close_timeout == 5.0
    with pytest.raises(hooks.SinkError, match="close_timeout: must be a finite number of seconds >= 0"):
        hooks.attach(tiny(), run="r", sink="http://127.0.0.1:1", spool=tmp_path, close_timeout=-1)


def test_all_gradients_none_at_step_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="hyperwatch")
    model = tiny()
    sink = hooks.MemorySink()
    mon = hooks.attach(model, run="zero-first", sink=sink, every=1)
    for step in range(3):
        one_step(mon, model, step, zero_first=True)
    mon.close()
    warnings = [r.getMessage() for r in caplog.records if "grad is None" in r.getMessage()]
    assert len(warnings) == 1
    assert "before opt.zero_grad()" in warnings[0] and "step 0" in warnings[0]
    assert sink.values("grad_norm") == {}

    caplog.clear()
    sink = hooks.MemorySink()
    with hooks.attach(model, run="right-order", sink=sink, every=1) as mon:
        for step in range(2):
            one_step(mon, model, step)
    assert not [r for r in caplog.records if "grad is None" in r.getMessage()]
    assert set(sink.values("grad_norm")) == {0, 1}


def test_upload_to_an_api_path_says_give_the_base_url(service: FakeService, tmp_path: Path) -> None:
    with hooks.attach(tiny(), run="off", sink=tmp_path / "off", every=1) as mon:
        one_step(mon, mon.model)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "hyperwatch", "upload", str(tmp_path / "off"), "--server", service.url + "/api/v1"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert f"give it without /api/v1, e.g. --server {service.url}" in done.stdout
