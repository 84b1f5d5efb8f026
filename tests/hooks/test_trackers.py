"""The TensorBoard and MLflow sinks, read back with each library's own reader: every point the
monitor emitted is there under its name (``name/layer_<i>`` per layer), at its step, with its value
(float64; NaN and +-Inf included, or for MLflow's SQL store the clamp MLflow makes, flagged)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from hyperwatch import hooks
from hyperwatch.hooks.schema import Point
from hyperwatch.hooks.sinks.trackers import metric_key
from tests.hooks.support import hf_model


def train(sink: list[hooks.Sink], steps: int = 3) -> tuple[list[Point], hooks.Monitor]:
    memory = hooks.MemorySink()
    model = hf_model("mixtral")
    mon = hooks.attach(model, run="tracked", sink=[memory, *sink], every=1, config={"lr": 1e-3}, group="trackers")
    for step in range(steps):
        x = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(step))
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        mon.step(step, loss=loss, lr=1e-3, tokens=24 * (step + 1))
        model.zero_grad(set_to_none=True)
    mon.log(1, {"user.nan": math.nan, "user.inf": math.inf, "user.neg_inf": -math.inf})
    mon.close()
    return memory.points, mon


def expected(points: list[Point]) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for p in points:
        out.setdefault(metric_key(p), {})[p.step] = p.value
    return out


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def test_tensorboard_event_files_hold_every_point(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    points, _ = train([hooks.TensorBoardSink(tmp_path)])
    want = expected(points)
    assert {"attention_z/layer_0", "router_z/layer_1", "max_vio/layer_1", "loss", "grad_norm"} <= set(want)
    acc = EventAccumulator(str(tmp_path / "tracked"), size_guidance={"tensors": 0})
    acc.Reload()
    got = {
        tag: {e.step: float(tensor_util.make_ndarray(e.tensor_proto)) for e in acc.Tensors(tag)}
        for tag in acc.Tags()["tensors"]
        if not tag.startswith("hyperwatch/")
    }
    assert set(got) == set(want)
    for key, steps in want.items():
        assert set(got[key]) == set(steps), key
        assert all(same(got[key][s], v) for s, v in steps.items()), (key, got[key], steps)
    assert got["user.inf"][1] == math.inf and got["user.neg_inf"][1] == -math.inf and math.isnan(got["user.nan"][1])
    status = acc.Tensors("hyperwatch/status/text_summary")
    assert tensor_util.make_ndarray(status[-1].tensor_proto).item() == b"finished"


@pytest.mark.parametrize("store", ["sqlite", "file"])
def test_mlflow_runs_hold_every_point(store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    if store == "file":  # MLflow keeps its file store in maintenance mode, behind this switch
        monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
        uri = f"file:{tmp_path / 'mlruns'}"
    else:
        uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sink = hooks.MlflowSink(uri, experiment="families")
    points, mon = train([sink])
    want = expected(points)
    client = MlflowClient(uri)
    run = client.get_run(sink.run_id)
    assert run.info.run_name == "tracked" and run.info.status == "FINISHED"
    assert set(run.data.metrics) == set(want)
    clamped = set()
    for key, steps in want.items():
        history = {m.step: m.value for m in client.get_metric_history(sink.run_id, key)}
        assert set(history) == set(steps), key
        for step, value in steps.items():
            if math.isinf(value) and store == "sqlite":  # MLflow's SQL store clamps; the tag says which
                assert history[step] == math.copysign(1.7976931348623157e308, value)
                clamped.add(key)
            else:
                assert same(history[step], value), (key, step, history[step], value)
    assert clamped == ({"user.inf", "user.neg_inf"} if store == "sqlite" else set())
    assert set(__import__("json").loads(run.data.tags["hyperwatch.infinite"])) == {"user.inf", "user.neg_inf"}
    assert '"lr": 0.001' in run.data.tags["hyperwatch.config"] and run.data.tags["hyperwatch.group"] == "trackers"
    assert mon.unavailable == {}
