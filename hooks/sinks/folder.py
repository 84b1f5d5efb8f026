"""The on-disk layout shared by the JSONL sink, the HTTP spool and ``hyperwatch upload``.

One folder per run, named after the run::

    <root>/<run>/run.json          the run's metadata (RunInfo JSON), "status" updated at the end
    <root>/<run>/batches.jsonl     JSONL sink: one wire-format batch per line, appended
    <root>/<run>/pending/*.json    HTTP spool: one batch per file, deleted once acknowledged
    <root>/<run>/status.json       HTTP spool: a final status not yet acknowledged
    <root>/<run>/update.json       HTTP spool: run fields learned later (unavailable) not yet acknowledged
    <root>/<run>/rejected/*.json   HTTP spool: batches the service refused as invalid (kept)
    <root>/<run>/inflight.json     HTTP spool: the pending files of the request being sent (see below)
    <root>/<run>/dropped.json      HTTP spool: points dropped while the spool was full (counts)

Exactly once across a crash of the sender: before posting a group of pending files under one
idempotency key, their names are written to ``inflight.json``; the files are deleted only after
the service acknowledged, and the manifest after them. So the next reader (a new sink on the
spool, or ``hyperwatch upload``) finding a manifest knows: all its files present -> resend exactly
that group (same key: the service stores it once even if it had already stored it); some missing
-> the service acknowledged it, the rest are deleted unsent.

Files are written to a temporary name and renamed, so a crash leaves either the old or the new
file, never half of one. A JSONL line cut by a crash is skipped with a warning when read.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hyperwatch.hooks.schema import Batch, Point, SchemaError, range_batch_id, sequence_range, validate_run_name

log = logging.getLogger(__name__)

RUN_FILE = "run.json"
JSONL_FILE = "batches.jsonl"
PENDING_DIR = "pending"
REJECTED_DIR = "rejected"
STATUS_FILE = "status.json"
UPDATE_FILE = "update.json"
INFLIGHT_FILE = "inflight.json"
DROPPED_FILE = "dropped.json"


def write_json_atomic(path: Path, obj: Any, fsync: bool = False) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, allow_nan=False, separators=(",", ":"))
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def run_folder(root: str | os.PathLike[str], run: str) -> Path:
    return Path(root) / validate_run_name(run)


def find_run_folders(root: Path) -> list[Path]:
    """``root`` itself when it is a run folder, else its children that are."""
    if (root / RUN_FILE).is_file():
        return [root]
    return sorted(p for p in root.iterdir() if p.is_dir() and (p / RUN_FILE).is_file())


def iter_jsonl(path: Path) -> Iterator[Batch]:
    """Batches of a JSONL file; a line cut short by a crash (the last one) is skipped with a warning."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                log.warning("%s:%d: not valid JSON (cut short by a crash?); skipped", path, lineno)
                continue
            try:
                yield Batch.from_json(obj)
            except SchemaError as exc:
                log.warning("%s:%d: %s; skipped", path, lineno, exc)


def pending_files(folder: Path) -> list[Path]:
    pending = folder / PENDING_DIR
    if not pending.is_dir():
        return []
    return sorted(p for p in pending.iterdir() if p.suffix == ".json" and not p.name.startswith("."))


def merge(batches: list[Batch]) -> Batch:
    """One batch of several, with an idempotency key derived from theirs (same set, same key)."""
    if len(batches) == 1:
        return batches[0]
    runs = {b.run for b in batches}
    if len(runs) != 1:
        raise ValueError(f"merge: batches of several runs {sorted(runs)}; merge one run at a time")
    points: list[Point] = [p for b in batches for p in b.points]
    return Batch(run=batches[0].run, points=points, batch_id=merged_id([b.batch_id for b in batches]))


def merged_id(batch_ids: list[str]) -> str:
    """The idempotency key of batches merged into one request: the range's sequence id when they are
    consecutive batches of one session (the service keeps it as part of the session's one range), else
    ``m`` and a digest of their ids."""
    ranges = sorted(r for r in map(sequence_range, batch_ids) if r is not None)
    one_session = len(ranges) == len(batch_ids) and len({r[0] for r in ranges}) == 1
    if one_session and all(after[1] == before[2] + 1 for before, after in itertools.pairwise(ranges)):
        return range_batch_id(ranges[0][0], ranges[0][1], ranges[-1][2])
    return "m" + hashlib.sha256("+".join(batch_ids).encode()).hexdigest()[:32]


def widen_steps(steps: tuple[int, int] | None, batch: Batch) -> tuple[int, int] | None:
    """The range of dropped steps, ``steps``, widened by a batch that was not spooled either."""
    seen = [p.step for p in batch.points]
    if not seen:
        return steps
    lo, hi = min(seen), max(seen)
    return (lo, hi) if steps is None else (min(lo, steps[0]), max(hi, steps[1]))


def record_drops(folder: Path, points: int, batches: int, steps: tuple[int, int] | None) -> None:
    """Write the drop count to ``dropped.json`` so a later upload sees the gap (best effort)."""
    try:
        write_json_atomic(folder / DROPPED_FILE, {"points": points, "batches": batches, "steps": steps})
    except OSError:
        log.debug("hooks: cannot record the drop count in %s", folder)


def write_inflight(folder: Path, files: list[Path]) -> None:
    """Record the group about to be posted (see the module docstring); fsynced: it guards a resend."""
    write_json_atomic(folder / INFLIGHT_FILE, {"files": [p.name for p in files]}, fsync=True)


def clear_inflight(folder: Path) -> None:
    (folder / INFLIGHT_FILE).unlink(missing_ok=True)


def recover_inflight(folder: Path) -> list[Path]:
    """The group a crashed sender was posting, to resend first; [] when there is none.

    A manifest whose files are partly gone was acknowledged (files are deleted only after a 2xx):
    its remaining files are deleted. An unreadable manifest is ignored (logged): at worst the
    group is resent under a new key and the service's (run, name, layer, step) key keeps it once.
    """
    path = folder / INFLIGHT_FILE
    if not path.is_file():
        return []
    try:
        names = read_json(path)["files"]
        if not isinstance(names, list) or not all(isinstance(n, str) and "/" not in n for n in names):
            raise ValueError("'files' must be a list of file names")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("%s: unreadable (%s); ignored", path, exc)
        clear_inflight(folder)
        return []
    files = [folder / PENDING_DIR / n for n in names]
    present = [p for p in files if p.is_file()]
    if present and len(present) < len(files):
        log.info("%s: the service acknowledged this group before the crash; %d files removed", path, len(present))
        for p in present:
            p.unlink(missing_ok=True)
        present = []
    if not present:
        clear_inflight(folder)
    return present


def load_batches(
    files: list[Path], max_points: int, single: bool, reject: Callable[[Path, str], None]
) -> tuple[list[Path], list[Batch]]:
    """The spool files of one request, in order: as many as fit in ``max_points`` (the first always;
    only the first when ``single``), each read; an unreadable one is handed to ``reject`` with why,
    and skipped."""
    chosen: list[Path] = []
    batches: list[Batch] = []
    n = 0
    for path in files:
        try:
            batch = Batch.from_json(read_json(path))
        except (OSError, ValueError, SchemaError) as exc:
            reject(path, f"unreadable spool file: {exc}")
            continue
        if batches and (single or n + len(batch.points) > max_points):
            break
        chosen.append(path)
        batches.append(batch)
        n += len(batch.points)
    return chosen, batches
