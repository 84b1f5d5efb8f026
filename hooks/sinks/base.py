"""The sink interface: where batches of points go. One small interface, fanned out.

A sink receives the run's metadata once (:meth:`Sink.start`), then batches (:meth:`Sink.write`),
then the run's final status (:meth:`Sink.finish`), and is closed once. ``write`` must return
quickly: it runs on the monitor's emitter thread, never on the network's time.
"""

from __future__ import annotations

import abc
import logging
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

from hyperwatch.hooks.jsonsafe import sanitize_json
from hyperwatch.hooks.schema import RUN_STATUSES, Batch, Point, validate_run_name

log = logging.getLogger(__name__)

RUN_FIELDS = frozenset(
    {
        "project",
        "group",
        "tags",
        "status",
        "depth",
        "width",
        "total_params",
        "active_params",
        "total_steps",
        "summary",
        "export_layers",
        "tokens",
        "flops",
        "lr",
        "optimizer",
        "parameterization",
        "unavailable",
    }
)
"""Run fields the service accepts beside ``name`` and ``config`` (POST /api/v1/runs)."""


class SinkError(ValueError):
    """A sink was configured wrongly; the message names the argument and the fix."""


def check_unavailable(value: Any) -> None:
    """``unavailable``: {indicator or "indicator@layer": reason}, stored with the run and shown on its page."""
    if value is None:
        return
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise SinkError(f"unavailable: must map indicator names to reasons (str -> str), got {value!r}")


@dataclass
class RunInfo:
    """What the service needs to create a run: its name, config and scale fields.

    ``attach_id`` identifies the process writing the run (one per ``hooks.attach``): the service
    refuses another process's writes to a run of the same name unless ``resume`` is set."""

    name: str
    config: dict[str, Any] = field(default_factory=dict)
    fields: dict[str, Any] = field(default_factory=dict)
    attach_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    resume: bool = False

    def __post_init__(self) -> None:
        validate_run_name(self.name)
        # A config may hold what JSON cannot (a non-UTF-8 path, NaN, a Path): repaired, never refused.
        self.config = sanitize_json(self.config)
        if "summary" in self.fields:
            self.fields["summary"] = sanitize_json(self.fields["summary"])
        unknown = set(self.fields) - RUN_FIELDS
        if unknown:
            raise SinkError(f"run fields {sorted(unknown)} are unknown; allowed: {sorted(RUN_FIELDS)}")
        status = self.fields.get("status")
        if status is not None and status not in RUN_STATUSES:
            raise SinkError(f"status: {status!r} is not one of {sorted(RUN_STATUSES)}")
        check_unavailable(self.fields.get("unavailable"))

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "config": self.config,
            **self.fields,
            "attach_id": self.attach_id,
            "resume": self.resume,
        }

    @classmethod
    def from_json(cls, obj: Any, where: str = "run.json") -> RunInfo:
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            raise SinkError(f"{where}: must be an object with a string 'name'")
        config = obj.get("config") or {}
        if not isinstance(config, dict):
            raise SinkError(f"{where}: 'config' must be an object")
        fields = {k: v for k, v in obj.items() if k not in ("name", "config", "attach_id", "resume")}
        run = cls(name=obj["name"], config=config, fields=fields)
        if isinstance(obj.get("attach_id"), str):  # a folder written by hooks that identify their process
            run.attach_id = obj["attach_id"]
            run.resume = obj.get("resume") is True
        else:
            run.attach_id = ""  # an older folder: created by name, as its hooks did
        return run

    def create_body(self) -> dict[str, Any]:
        """The POST /api/v1/runs body: without ``attach_id``/``resume`` for a run that has none."""
        body = self.to_json()
        if not self.attach_id:
            del body["attach_id"], body["resume"]
        return body


class Sink(abc.ABC):
    """Base sink: every method but ``write`` is optional."""

    def start(self, run: RunInfo) -> None:
        return None

    @abc.abstractmethod
    def write(self, batch: Batch) -> None:
        """Deliver one batch (or queue it for delivery); never block training on the network."""

    def update(self, fields: dict[str, Any]) -> None:
        """Run fields learned after ``start`` (e.g. ``{"unavailable": {...}}``): store them with the run."""
        return None

    def finish(self, status: str) -> None:
        return None

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until what was written is delivered; False if it is not after ``timeout`` seconds."""
        return True

    def close(self) -> None:
        return None


class FanOut(Sink):
    """Sends everything to several sinks; a failing sink is logged and never stops the others."""

    def __init__(self, sinks: list[Sink]) -> None:
        self.sinks = list(sinks)

    def _each(self, method: str, *args: Any) -> list[Any]:
        results = []
        for sink in self.sinks:
            try:
                results.append(getattr(sink, method)(*args))
            except Exception:  # a sink must never take training down
                log.exception("hooks: sink %s.%s failed", type(sink).__name__, method)
                results.append(None)
        return results

    def start(self, run: RunInfo) -> None:
        self._each("start", run)

    def write(self, batch: Batch) -> None:
        self._each("write", batch)

    def update(self, fields: dict[str, Any]) -> None:
        self._each("update", fields)

    def finish(self, status: str) -> None:
        self._each("finish", status)

    def flush(self, timeout: float | None = None) -> bool:
        return all(r is not False for r in self._each("flush", timeout))

    def close(self) -> None:
        self._each("close")


class MemorySink(Sink):
    """Keeps everything in memory (tests, notebooks)."""

    def __init__(self) -> None:
        self.runs: list[RunInfo] = []
        self.batches: list[Batch] = []
        self.statuses: list[str] = []
        self.updates: list[dict[str, Any]] = []
        self.closed = False
        self._lock = threading.Lock()

    def start(self, run: RunInfo) -> None:
        self.runs.append(run)

    def write(self, batch: Batch) -> None:
        with self._lock:
            self.batches.append(batch)

    def update(self, fields: dict[str, Any]) -> None:
        self.updates.append(dict(fields))

    def finish(self, status: str) -> None:
        self.statuses.append(status)

    def close(self) -> None:
        self.closed = True

    @property
    def points(self) -> list[Point]:
        with self._lock:
            return [p for b in self.batches for p in b.points]

    def values(self, name: str, layer: int | None = None) -> dict[int, float]:
        """step -> value of one metric (one layer, or run-level when layer is None)."""
        return {p.step: p.value for p in self.points if p.name == name and p.layer == layer}
