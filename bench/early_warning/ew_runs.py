"""The recorded runs of the family benchmark, read and checked (``bench/early_warning/ew_record.py`` writes them).

Each ``DIR/runs/<name>.json`` becomes a :class:`Run`; a file that is not readable, lacks a field or has
one of the wrong type is an :class:`InputError` naming the file, the field and the fix.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ew_replay import RunTrace, decode_value, to_columns

from hyperwatch.hooks.columns import PointColumns
from hyperwatch.monitor.thresholds.defaults import DEFAULT_THRESHOLDS

REQUIRED = ("name", "family", "arm", "seed", "steps", "onset", "reference", "fault", "losses", "logged_steps",
            "batches", "scrapes", "service_alerts")  # fmt: skip
Overrides = dict[str, float]


class InputError(Exception):
    """Bad input: the CLI exits 2 with the message."""


@dataclass
class Run:
    name: str
    family: str
    arm: str
    seed: int
    steps: int
    onset: int | None
    reference: bool
    fault: str | None
    losses: list[float]
    logged_steps: list[int]
    batches: list[PointColumns]
    scrapes: dict[str, list[float | None]]
    service_alerts: list[dict[str, Any]]
    trace: RunTrace | None = field(default=None, repr=False)


def read_object(path: Path, where: str, shape: str) -> dict[str, Any]:
    """A JSON object from ``path``; InputError starting with ``where`` (unreadable, or not ``shape``)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"{where}: not readable JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise InputError(f"{where}: {shape}")
    return doc


def load_run(path: Path) -> Run:
    """One recorded run; InputError naming the file and the field."""
    fix = "re-record it with bench/early_warning/ew_record.py"
    doc = read_object(path, f"{path}", f"a run file holds one JSON object: {fix}")
    missing = [k for k in REQUIRED if k not in doc]
    if missing:
        raise InputError(f"{path}: missing field(s) {', '.join(missing)}: {fix}")
    try:
        return Run(
            name=str(doc["name"]),
            family=str(doc["family"]),
            arm=str(doc["arm"]),
            seed=int(doc["seed"]),
            steps=int(doc["steps"]),
            onset=None if doc["onset"] is None else int(doc["onset"]),
            reference=bool(doc["reference"]),
            fault=doc["fault"],
            losses=[decode_value(v) for v in doc["losses"]],
            logged_steps=[int(s) for s in doc["logged_steps"]],
            batches=[to_columns(b) for b in doc["batches"]],
            scrapes=dict(doc["scrapes"]),
            service_alerts=list(doc["service_alerts"]),
        )
    except (TypeError, ValueError) as exc:
        raise InputError(f"{path}: a field has the wrong type ({exc}): {fix}") from exc


def load_dir(d: Path) -> list[Run]:
    folder = d / "runs"
    if not folder.is_dir():
        raise InputError(f"{d}: no runs/ folder: give the folder ew_record.py wrote (DIR/runs/<name>.json)")
    files = sorted(folder.glob("*.json"))
    if not files:
        raise InputError(f"{folder}: no run files (*.json): record them with bench/early_warning/ew_record.py")
    runs = [load_run(p) for p in files]
    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        raise InputError(f"{folder}: two run files share a name: each run's 'name' must be unique")
    return runs


def check_thresholds(over: Any, where: str) -> Overrides:
    if not isinstance(over, dict):
        raise InputError(f"{where}: a JSON object of threshold name -> value")
    for k, v in over.items():
        if k not in DEFAULT_THRESHOLDS:
            raise InputError(f"{where}: unknown threshold {k!r}; known: {', '.join(DEFAULT_THRESHOLDS)}")
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise InputError(f"{where}: {k}: a number, got {v!r}")
    return {k: float(v) for k, v in over.items()}
