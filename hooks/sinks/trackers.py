"""Sinks into the experiment trackers a team already uses: TensorBoard event files and MLflow.

They let a team start without the service (which stays the full product: alerts, scale
comparison, incidents). Both write the indicators under the same names: ``attention_z`` for
run-level values, ``attention_z/layer_3`` for layer 3 (a ``/`` groups a metric's layers in both
UIs), at the same steps; the run's config, the unavailable indicators and the final status go
with the run. TensorBoard gets scalar summaries (what ``EventAccumulator.Scalars`` and the Scalars
dashboard read); MLflow gets the config as params too (nested keys joined with dots, values as
strings, as ``mlflow.log_params`` writes them), and its ``hyperwatch.status`` tag follows the run
to its final status. Each library is imported when its sink is built, never before (``pip install
'hyperwatch[tensorboard]'`` / ``'hyperwatch[mlflow]'``), so ``hyperwatch.hooks`` still needs only
torch, numpy and the standard library.

NaN and +-Inf: TensorBoard event files keep both. A scalar summary is a float32 (TensorBoard's
format), so a value keeps about 7 significant digits and one beyond float32's range (above
3.4e38) reads back as +-Inf.
MLflow's file store keeps both; its SQL stores (``sqlite:///...``, PostgreSQL) keep NaN but
clamp +-Inf to +-1.797e308 (MLflow's own behaviour): the sink then tags the run
``hyperwatch.infinite`` with the metric keys that were infinite, so a clamped value can be told
from a real one.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from pathlib import Path
from typing import Any

from hyperwatch.hooks.jsonsafe import sanitize_json
from hyperwatch.hooks.schema import Batch, Point
from hyperwatch.hooks.sinks.base import RunInfo, Sink, SinkError
from hyperwatch.hooks.sinks.folder import run_folder


def metric_key(point: Point) -> str:
    """The tracker's key of a point: its name, with ``/layer_<i>`` for a per-layer value."""
    return point.name if point.layer is None else f"{point.name}/layer_{point.layer}"


def _require(module: str, extra: str) -> Any:
    try:
        return __import__(module, fromlist=["_"])
    except ImportError as exc:
        raise SinkError(f"{module} is not installed: pip install 'hyperwatch[{extra}]' ({exc})") from exc


class TensorBoardSink(Sink):
    """Event files under ``<logdir>/<run name>/`` (``tensorboard --logdir <logdir>`` shows them)."""

    def __init__(self, logdir: str | os.PathLike[str]) -> None:
        if not str(logdir):
            raise SinkError("logdir: the TensorBoard folder is empty; pass e.g. TensorBoardSink('runs/tb')")
        tb = _require("torch.utils.tensorboard", "tensorboard")
        self._writer_class = tb.SummaryWriter
        self.logdir = Path(logdir)
        self.writer: Any = None

    def start(self, run: RunInfo) -> None:
        self.writer = self._writer_class(log_dir=str(run_folder(self.logdir, run.name)))
        self.writer.add_text("hyperwatch/run", _markdown_json(run.to_json()), 0)

    def _need(self) -> Any:
        if self.writer is None:
            raise SinkError("TensorBoardSink.write: start(run) was not called; the monitor calls it in attach()")
        return self.writer

    def write(self, batch: Batch) -> None:
        writer = self._need()
        for p in batch.points:
            # Scalar summaries (new_style=False): tensor summaries are skipped by Scalars() readers.
            writer.add_scalar(metric_key(p), p.value, p.step, new_style=False)

    def update(self, fields: dict[str, Any]) -> None:
        if self.writer is not None:
            self.writer.add_text("hyperwatch/update", _markdown_json(fields), 0)

    def finish(self, status: str) -> None:
        if self.writer is not None:
            self.writer.add_text("hyperwatch/status", status, 0)

    def flush(self, timeout: float | None = None) -> bool:
        if self.writer is not None:
            self.writer.flush()
        return True

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


_MLFLOW_STATUS = {"finished": "FINISHED", "failed": "FAILED", "crashed": "FAILED", "interrupted": "KILLED"}
_MLFLOW_BATCH = 1000  # metrics per log_batch call (MLflow's limit)
_PARAMS_BATCH = 100  # params per log_batch call (MLflow's MAX_PARAMS_TAGS_PER_BATCH)
_KEY_LIMIT = 250  # characters of a param key (MLflow's MAX_ENTITY_KEY_LENGTH)
_PARAM_LIMIT = 6000  # characters of a param value (MLflow's MAX_PARAM_VAL_LENGTH since 2.x)
_TAG_LIMIT = 5000  # characters of a tag value kept (MLflow stores up to 8000)
_BAD_KEY_CHARS = re.compile(r"[^\w.\- /]")  # what MLflow refuses in a key (":" too: Windows does)


class MlflowSink(Sink):
    """A run in an MLflow tracking store: ``MlflowSink("sqlite:///mlflow.db")``, a ``file:`` folder
    or a tracking server URL; ``experiment`` is created when it does not exist."""

    def __init__(self, tracking_uri: str, experiment: str = "hyperwatch") -> None:
        if not isinstance(tracking_uri, str) or not tracking_uri:
            raise SinkError("tracking_uri: give an MLflow tracking URI, e.g. 'sqlite:///mlflow.db' or 'file:./mlruns'")
        _require("mlflow", "mlflow")
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.experiment = experiment
        self.run_id: str | None = None
        self._infinite: set[str] = set()

    def start(self, run: RunInfo) -> None:
        found = self.client.get_experiment_by_name(self.experiment)
        experiment_id = found.experiment_id if found is not None else self.client.create_experiment(self.experiment)
        tags = {"hyperwatch.config": _clip(json.dumps(sanitize_json(run.config), sort_keys=True))}
        for key, value in run.fields.items():
            tags[f"hyperwatch.{key}"] = _clip(value if isinstance(value, str) else json.dumps(sanitize_json(value)))
        self.run_id = self.client.create_run(experiment_id, run_name=run.name, tags=tags).info.run_id
        params = mlflow_params(run.config)
        for start in range(0, len(params), _PARAMS_BATCH):
            self.client.log_batch(self.run_id, params=params[start : start + _PARAMS_BATCH])

    def _need(self) -> str:
        if self.run_id is None:
            raise SinkError("MlflowSink.write: start(run) was not called; the monitor calls it in attach()")
        return self.run_id

    def write(self, batch: Batch) -> None:
        from mlflow.entities import Metric

        run_id = self._need()
        now = int(time.time() * 1000)
        metrics = [Metric(metric_key(p), p.value, now, p.step) for p in batch.points]
        for start in range(0, len(metrics), _MLFLOW_BATCH):
            self.client.log_batch(run_id, metrics=metrics[start : start + _MLFLOW_BATCH])
        infinite = {metric_key(p) for p in batch.points if math.isinf(p.value)} - self._infinite
        if infinite:
            self._infinite |= infinite
            self.client.set_tag(run_id, "hyperwatch.infinite", _clip(json.dumps(sorted(self._infinite))))

    def update(self, fields: dict[str, Any]) -> None:
        if self.run_id is None:
            return
        for key, value in fields.items():
            text = value if isinstance(value, str) else json.dumps(sanitize_json(value), sort_keys=True)
            self.client.set_tag(self.run_id, f"hyperwatch.{key}", _clip(text))

    def finish(self, status: str) -> None:
        if self.run_id is None:
            return
        self.client.set_tag(self.run_id, "hyperwatch.status", _clip(status))  # created as "running"
        if status in _MLFLOW_STATUS:
            self.client.set_terminated(self.run_id, status=_MLFLOW_STATUS[status])


def mlflow_params(config: dict[str, Any]) -> list[Any]:
    """The run's config as MLflow params, as ``mlflow.log_params`` users expect them: nested keys
    joined with dots (``training_args.learning_rate``), values as strings (lists as JSON), within
    MLflow's limits: a key MLflow would refuse has its other characters replaced by ``_`` (one too
    long is left out: the ``hyperwatch.config`` tag keeps it), a value too long is cut."""
    from mlflow.entities import Param

    flat: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for key, sub in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), sub)
            return
        key = _BAD_KEY_CHARS.sub("_", prefix).replace("/", "_").strip()
        if not key or len(key) > _KEY_LIMIT or key.startswith("..") or key == "." or key in flat:
            return
        text = json.dumps(value, sort_keys=True) if isinstance(value, (list, dict)) else str(value)
        flat[key] = text if len(text) <= _PARAM_LIMIT else text[: _PARAM_LIMIT - 3] + "..."

    walk("", sanitize_json(config))
    return [Param(key, value) for key, value in flat.items()]


def _clip(text: str) -> str:
    return text if len(text) <= _TAG_LIMIT else text[: _TAG_LIMIT - 3] + "..."


def _markdown_json(obj: Any) -> str:
    return "```\n" + json.dumps(sanitize_json(obj), indent=1, sort_keys=True) + "\n```"
