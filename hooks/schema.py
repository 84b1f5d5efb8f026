"""The one wire format: a batch of metric points, and the registry of metric names.

A batch is the unit everywhere: what the HTTP sink posts, what the JSONL sink writes one per
line, what the spool keeps and what ``hyperwatch upload`` replays::

    {"batch_id": "<session hex>-<n>", "run": "<run name>",
     "points": [{"name": "attention_z", "layer": 3, "step": 120, "tokens": 983040, "value": 214.7},
                {"name": "loss", "layer": null, "step": 120, "tokens": 983040, "value": "NaN"}]}

Non-finite values are training facts and travel faithfully: standard JSON has no literal for
them, so they are written as the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"`` and read
back as real IEEE values. Finite values are plain JSON numbers.

This module depends on the standard library only: it is imported by training processes
(hooks) and by the service (monitor), which validates the same rules with pydantic.
"""

from __future__ import annotations

import math
import os
import re
import secrets
import threading
from dataclasses import dataclass
from typing import Any, Literal, get_args

SCHEMA_VERSION = 1

RunStatus = Literal["running", "finished", "failed", "crashed", "killed", "interrupted"]
"""The one list of run statuses, shared by the hooks (``Monitor.finish``) and the service.

``killed``: the process was stopped from outside (a signal); ``interrupted``: the user pressed
Ctrl-C (the run can be resumed); ``crashed``: an exception in the training code. "Stale" is not a
status: the service derives it from the time since a running run's last point."""
RUN_STATUSES: frozenset[str] = frozenset(get_args(RunStatus))


@dataclass(frozen=True)
class MetricSpec:
    """One indicator: its name everywhere, whether it is per layer, its unit and meaning."""

    name: str
    per_layer: bool
    unit: str
    description: str


_SPECS = [
    MetricSpec("attention_z", True, "logit^2", "mean over (batch, head, query) of LSE(attention scores)^2"),
    MetricSpec(
        "attention_lse_max",
        True,
        "logit",
        "max over queries of the attention LSE; per head as attention_lse_max.h<k>, the layer's max over heads "
        "without a qualifier (the max logit lies in [value - log T, value])",
    ),
    MetricSpec("output_z", False, "logit^2", "mean over positions of LSE(LM head logits over the vocabulary)^2"),
    MetricSpec("router_z", True, "logit^2", "mean over tokens of LSE(router logits over all routed experts)^2"),
    MetricSpec("attention_rms", True, "activation", "RMS of the attention branch output (after residual mult)"),
    MetricSpec("mlp_rms", True, "activation", "RMS of the MLP or MoE branch output (after residual mult)"),
    MetricSpec("attention_outlier_ratio", True, "ratio", "fraction of attention-output elements > 5 sigma"),
    MetricSpec("mlp_outlier_ratio", True, "ratio", "fraction of MLP/MoE-output elements > 5 sigma"),
    MetricSpec("max_vio", True, "ratio", "(max_i c_i - mean_i c_i) / mean_i c_i over routed experts"),
    MetricSpec("aux_loss", True, "nats", "Switch load-balancing loss of an MoE layer (gamma included)"),
    MetricSpec("weight_norm", True, "norm", "Frobenius norm of a hidden matrix (name suffix: which)"),
    MetricSpec("update_ratio", True, "ratio", "||W_t - W_{t-1}||_F / ||W_{t-1}||_F of a hidden matrix"),
    MetricSpec("loss", False, "nats", "training loss of the logged step (mean over micro-batches)"),
    MetricSpec("val_loss", False, "nats", "validation loss on held-out tokens"),
    MetricSpec("lr", False, "lr", "peak-relative learning rate of the step (global eta)"),
    MetricSpec("grad_norm", False, "norm", "global gradient norm before clipping"),
    MetricSpec("tokens_per_second", False, "tokens/s", "training throughput"),
    MetricSpec("tokens", False, "tokens", "training tokens seen"),
    MetricSpec(
        "cuda_max_memory_allocated",
        False,
        "bytes",
        "torch.cuda.max_memory_allocated of the model's device on rank 0 at a logged step (running peak; never reset)",
    ),
    MetricSpec("host_rss", False, "bytes", "resident memory of the rank-0 training process at a logged step"),
]

METRICS: dict[str, MetricSpec] = {s.name: s for s in _SPECS}
"""The registry: the only base names accepted on the wire (plus ``user.*`` free names)."""

# A name is a registered base, optionally qualified (``weight_norm.attn.q_proj``), or a free
# user metric under the ``user.`` prefix. Qualifiers are identifiers joined by dots.
_QUALIFIER = r"(?:\.[A-Za-z0-9_]{1,64}){0,6}"
_NAME_RE = re.compile(rf"^(?P<base>[a-z_]{{1,40}}){_QUALIFIER}\Z")  # \Z: "$" would let "loss\n" through
_USER_RE = re.compile(rf"^user{_QUALIFIER}\Z")
MAX_NAME_LENGTH = 128
MAX_LAYER = 4096
MAX_STEP = 2**62
MAX_POINTS_PER_BATCH = 50_000
MAX_RUN_NAME_LENGTH = 200
_RUN_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:+=@-]{0,199}\Z")

NONFINITE_TO_WIRE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}
WIRE_TO_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


class SchemaError(ValueError):
    """A batch or point that breaks the wire format; the message names the field and the fix."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


_HEAD_RE = re.compile(r"^attention_lse_max\.h(\d+)\Z")


def head_name(head: int) -> str:
    """The wire name of one attention head's max LSE: ``attention_lse_max.h3`` (layer in ``layer``)."""
    return f"attention_lse_max.h{head}"


def head_of(name: str) -> int | None:
    """The head index of a per-head name, None for any other name."""
    m = _HEAD_RE.match(name)
    return int(m.group(1)) if m else None


def base_name(name: str) -> str:
    """``weight_norm.attn.q_proj`` -> ``weight_norm``; ``user.foo`` -> ``user``."""
    return name.split(".", 1)[0]


def validate_name(name: Any, field: str = "name") -> str:
    if not isinstance(name, str):
        raise SchemaError(field, f"must be a string, got {type(name).__name__}")
    if len(name) > MAX_NAME_LENGTH:
        raise SchemaError(field, f"is {len(name)} characters; the limit is {MAX_NAME_LENGTH}")
    if _USER_RE.match(name):
        return name
    m = _NAME_RE.match(name)
    if not m or m.group("base") not in METRICS:
        raise SchemaError(
            field,
            f"unknown metric name {name!r}; use one of {sorted(METRICS)} "
            "(optionally with '.qualifier' parts) or a free name under 'user.'",
        )
    return name


def encode_value(value: float) -> float | str:
    """A float as it travels in JSON: finite as a number, non-finite as its string."""
    v = float(value)
    if math.isfinite(v):
        return v
    return NONFINITE_TO_WIRE[repr(v)]


def decode_value(value: Any, field: str = "value") -> float:
    """The inverse of :func:`encode_value`; rejects anything that is not a number or those strings."""
    if isinstance(value, bool):
        raise SchemaError(field, "must be a number or one of 'NaN', 'Infinity', '-Infinity', not a boolean")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value in WIRE_TO_NONFINITE:
        return WIRE_TO_NONFINITE[value]
    raise SchemaError(field, f"must be a number or one of 'NaN', 'Infinity', '-Infinity'; got {value!r}")


def _int_field(value: Any, field: str, lo: int, hi: int, nullable: bool = False) -> int | None:
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            kind = "an integer or null" if nullable else "an integer"
            raise SchemaError(field, f"must be {kind}, got {value!r}")
    if not lo <= value <= hi:
        raise SchemaError(field, f"must be between {lo} and {hi}, got {value}")
    return int(value)


@dataclass(frozen=True)
class Point:
    """One value of one metric at one step. ``layer`` is the block index from 0, or None."""

    name: str
    step: int
    value: float
    layer: int | None = None
    tokens: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "layer": self.layer,
            "step": self.step,
            "tokens": self.tokens,
            "value": encode_value(self.value),
        }

    @classmethod
    def from_json(cls, obj: Any, where: str = "point") -> Point:
        if not isinstance(obj, dict):
            raise SchemaError(where, f"must be an object, got {type(obj).__name__}")
        unknown = set(obj) - {"name", "layer", "step", "tokens", "value"}
        if unknown:
            raise SchemaError(where, f"unknown fields {sorted(unknown)}; allowed: name, layer, step, tokens, value")
        for required in ("name", "step", "value"):
            if required not in obj:
                raise SchemaError(f"{where}.{required}", "is required")
        return cls(
            name=validate_name(obj["name"], f"{where}.name"),
            layer=_int_field(obj.get("layer"), f"{where}.layer", 0, MAX_LAYER, nullable=True),
            step=_int_field(obj["step"], f"{where}.step", 0, MAX_STEP),  # type: ignore[arg-type]
            tokens=_int_field(obj.get("tokens"), f"{where}.tokens", 0, MAX_STEP, nullable=True),
            value=decode_value(obj["value"], f"{where}.value"),
        )


def validate_run_name(run: Any, field: str = "run") -> str:
    if not isinstance(run, str) or not _RUN_RE.match(run):
        raise SchemaError(
            field,
            f"must be 1-{MAX_RUN_NAME_LENGTH} characters of letters, digits and _.:+=@- "
            f"starting with a letter or digit; got {run!r}",
        )
    return run


SEQUENCE_ID = re.compile(r"([0-9a-f]{32})-([0-9a-f]{1,12})(?:-([0-9a-f]{1,12}))?")
"""A sequence batch id: a writer session (32 hex digits) and the batch's number in the session's
sequence for its run, or a range of numbers (``<session>-<first>-<last>``: batches merged into one
request). The service keeps a session's claimed numbers as ranges, one row for a run's whole session
(``batch_ranges``), where any other id costs a row per request."""

_session = secrets.token_hex(16)  # this process's writer session
_next_seq: dict[str, int] = {}  # per run name: the number of its next batch
_id_lock = threading.Lock()


def _ids_after_fork() -> None:
    """A forked child (a data loader's worker, say) is a session of its own, with a lock of its own (the
    parent's may have been held): the parent's numbers go on in the parent."""
    global _id_lock, _session, _next_seq
    _id_lock, _session, _next_seq = threading.Lock(), secrets.token_hex(16), {}


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_ids_after_fork)


def new_batch_id(run: str = "") -> str:
    """The next batch id of ``run`` in this process: ``<session>-<n>`` (:data:`SEQUENCE_ID`), ``n`` counting
    the run's batches from 0 in hex. Unique as long as the session is (128 random bits a process), and
    consecutive, so the service stores a run's ids as one range instead of a row per request."""
    with _id_lock:
        seq = _next_seq.get(run, 0)
        _next_seq[run] = seq + 1
        session = _session
    return f"{session}-{seq:x}"


def sequence_range(batch_id: str) -> tuple[str, int, int] | None:
    """(session, first, last) of a sequence batch id (a range written high to low means the same numbers);
    None for any other id."""
    found = SEQUENCE_ID.fullmatch(batch_id)
    if found is None:
        return None
    ends = sorted({int(found[2], 16), int(found[3] or found[2], 16)})
    return found[1], ends[0], ends[-1]


def range_batch_id(session: str, first: int, last: int) -> str:
    """The sequence id of batches ``first..last`` of a session merged into one request."""
    return f"{session}-{first:x}" if first == last else f"{session}-{first:x}-{last:x}"


@dataclass
class Batch:
    """The unit of transport; ``batch_id`` is the idempotency key of a send."""

    run: str
    points: list[Point]
    batch_id: str = ""  # "": the run's next sequence id in this process (new_batch_id)

    def __post_init__(self) -> None:
        if not self.batch_id:
            self.batch_id = new_batch_id(self.run)

    def to_json(self) -> dict[str, Any]:
        return {"batch_id": self.batch_id, "run": self.run, "points": [p.to_json() for p in self.points]}

    @classmethod
    def from_json(cls, obj: Any) -> Batch:
        if not isinstance(obj, dict):
            raise SchemaError("batch", f"must be an object, got {type(obj).__name__}")
        unknown = set(obj) - {"batch_id", "run", "points"}
        if unknown:
            raise SchemaError("batch", f"unknown fields {sorted(unknown)}; allowed: batch_id, run, points")
        batch_id = obj.get("batch_id")
        if not isinstance(batch_id, str) or not re.fullmatch(r"[A-Za-z0-9_-]{8,64}", batch_id):
            raise SchemaError("batch_id", f"must be 8-64 characters of letters, digits, _ or -; got {batch_id!r}")
        points = obj.get("points")
        if not isinstance(points, list):
            raise SchemaError("points", "must be a list of points")
        if len(points) > MAX_POINTS_PER_BATCH:
            raise SchemaError("points", f"has {len(points)} points; the limit is {MAX_POINTS_PER_BATCH} per batch")
        return cls(
            run=validate_run_name(obj.get("run")),
            points=[Point.from_json(p, f"points[{i}]") for i, p in enumerate(points)],
            batch_id=batch_id,
        )
