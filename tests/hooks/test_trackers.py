"""The TensorBoard and MLflow sinks, read back with each library's own reader: every point the
monitor emitted is there under its name (``name/layer_<i>`` per layer), at its step, with its value
(NaN and +-Inf included; TensorBoard's scalars are float32, read by ``EventAccumulator.Scalars``;
for MLflow's SQL store the clamp MLflow makes, flagged). MLflow also gets the config as params and
the final status in its ``hyperwatch.status`` tag."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from hyperwatch import hooks
from hyperwatch.hooks.schema import Point
from hyperwatch.hooks.sinks.trackers import metric_key
from tests.hooks.support import hf_model

CONFIG = {
    "lr": 1e-3,
    "optimizer": {"name": "adamw", "betas": [0.9, 0.95], "nested": {"warmup": 100}},
    "use_bias": False,
    "schedule": None,
    "long": "x" * 7000,
    "odd key:name?": 1,
    **{f"extra_{i}": i for i in range(150)},  # more than one log_batch call of params (100 each)
}


def train(sink: list[hooks.Sink], steps: int = 3) -> tuple[list[Point], hooks.Monitor]:
    memory = hooks.MemorySink()
    model = hf_model("mixtral")
    mon = hooks.attach(model, run="tracked", sink=[memory, *sink], every=1, config=CONFIG, group="trackers")
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
    # How scripts read TensorBoard logs: Scalars(tag) (a tensor summary would raise KeyError here).
    acc = EventAccumulator(str(tmp_path / "tracked"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == set(want)
    got = {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}
    for key, steps in want.items():
        assert set(got[key]) == set(steps), key
        # scalar summaries are float32: the value as float32 holds it
        assert all(same(got[key][s], float(np.float32(v))) for s, v in steps.items()), (key, got[key], steps)
    assert got["user.inf"][1] == math.inf and got["user.neg_inf"][1] == -math.inf and math.isnan(got["user.nan"][1])
    assert got["loss"][0] == pytest.approx(want["loss"][0], rel=1e-6)
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
    assert sink.run_id is not None
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
    assert run.data.tags["hyperwatch.config"].startswith('{"_hyperwatch": ')  # the JSON tag stays (clipped)
    assert run.data.tags["hyperwatch.group"] == "trackers"
    assert mon.unavailable == {}
    # The final status, not the "running" the run was created with.
    assert run.data.tags["hyperwatch.status"] == "finished"
    # The config as MLflow params: dotted keys, string values, within MLflow's limits.
    params = run.data.params
    assert params["lr"] == "0.001" and params["use_bias"] == "False" and params["schedule"] == "None"
    assert params["optimizer.name"] == "adamw" and params["optimizer.nested.warmup"] == "100"
    assert json.loads(params["optimizer.betas"]) == [0.9, 0.95]
    assert params["odd key_name_"] == "1"  # characters MLflow refuses in a key become "_"
    assert len(params["long"]) == 6000 and params["long"].endswith("...")
    assert all(params[f"extra_{i}"] == str(i) for i in range(150))
    assert params["_hyperwatch.every"] == "1"
