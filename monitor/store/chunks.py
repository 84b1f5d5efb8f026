"""Sealed ranges of a series packed into one row: the codec of ``metric_chunks.data`` and its reads.

A row of ``metric_chunks`` is either a *chunk* (format version 1, below: 16 steps, raw doubles, what
a batch seals) or a *segment* (version 2, :mod:`monitor.store.segcodec`: up to ``SEGMENT_STEPS``
steps compressed, keyed by the first chunk of its aligned range). Every read here takes both: a
read of chunks ``[ca, cb]`` starts at the first chunk of ``ca``'s segment range (a segment holding
``ca`` has its key there; rows never overlap) and keeps the decoded points inside the steps asked.

A chunk is one (run, name, layer) and the steps ``[c * CHUNK_STEPS, (c + 1) * CHUNK_STEPS)``. Why:
one row per point costs ~94 B on PostgreSQL whatever is in it (24 B tuple header, 4 B line pointer,
alignment, a 28 B index entry); one row per 16 points spreads that over 16 and keeps ~8 B of payload
per point (measured: see the sizing note in :mod:`monitor.store.models`).

The blob, little-endian, version 1::

    u8 version | u8 flags | u16 n | steps | tokens | n x f64 values

- steps: ``DENSE`` (consecutive): one u16, the first step's offset from the chunk's first step;
  otherwise n x u16 offsets (hence ``CHUNK_STEPS <= 65536``);
- tokens: ``TOK_NONE`` (all NULL): nothing; ``TOK_LINEAR`` (``t0 + dt * (step - first step)``, what
  a constant batch size gives): i64 t0, i64 dt; otherwise (``TOK_MASK`` when some are NULL: a
  bitmap of ceil(n / 8) bytes, set = NULL) n x i64;
- values: IEEE doubles as sent, NaN as NaN (the store's NULL <-> NaN mapping is applied here, so a
  decoded point reads exactly like a ``metric_points`` row: value None for NaN, +-Inf themselves).

Packing and unpacking use ``struct`` (for 16 points quicker than numpy). Points are decoded in
Python: a chunk is small and the reads that decode (range edges, open tails,
non-finite events, trailing windows) touch a few chunks; wide reads go to the rollups.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection

from hyperwatch.hooks.columns import NULL_INT
from hyperwatch.monitor.store import segcodec, toast
from hyperwatch.monitor.store.bulk import read_in_ranges
from hyperwatch.monitor.store.models import (
    CHUNK_ROWS,
    CHUNK_STEPS,
    NONFINITE_PREDICATE,
    OPEN_CHUNKS,
    SEGMENT_CHUNKS,
    hot_relation,
)

Cand = tuple[int, int | None, float | None]  # step, tokens, sql value (None = NaN)
KEY = "run_id = :run_id AND name_id = :name_id AND layer = :layer"
CHUNK_COLUMNS = (
    "run_id",
    "name_id",
    "layer",
    "chunk",
    "nonfinite",
    "data",
    "min_step",
    "min_value",
    "max_step",
    "max_value",
)
CHUNK_TYPES = ("int", "int", "int", "bigint", "int", "bytea", "bigint", "float8", "bigint", "float8")
CHUNK_KEY = ("run_id", "name_id", "layer", "chunk")
CHUNK_SET_0014 = ", ".join(f"{c} = excluded.{c}" for c in CHUNK_COLUMNS[4:])
"""An upsert's SET clause before revision 0016 (no ``data_ext``: the 0014 migration packs through it)."""
CHUNK_SET = CHUNK_SET_0014 + ", data_ext = excluded.data_ext"
"""An upsert's SET clause: a row written without ``data_ext`` (every 16-step chunk) clears it."""
SEGMENT_COLUMNS = (*CHUNK_COLUMNS, "data_ext")
"""A segment row: its blob cut in two on PostgreSQL (revision 0016, :mod:`monitor.store.toast`)."""
SEGMENT_TYPES = (*CHUNK_TYPES, "bytea")

VERSION = 1
DENSE, TOK_NONE, TOK_LINEAR, TOK_MASK = 1, 2, 4, 8
_HEAD = struct.Struct("<BBH")
_U16 = struct.Struct("<H")
_LINEAR = struct.Struct("<qq")
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
assert CHUNK_STEPS <= 65536


def encode(chunk: int, points: Sequence[Cand]) -> tuple[bytes, int]:
    """(blob, count of NaN/+-Inf values) of step-sorted, distinct ``points`` of chunk ``chunk``.

    Plain ``struct`` packing: for 16 points it is several times quicker than building numpy arrays.
    """
    n = len(points)
    if not 0 < n <= CHUNK_STEPS:
        raise ValueError(f"points: a chunk holds 1 to {CHUNK_STEPS} points, got {n}")
    base = chunk * CHUNK_STEPS
    steps, tokens, raw = zip(*points)
    first, last = steps[0] - base, steps[-1] - base
    if first < 0 or last >= CHUNK_STEPS:
        raise ValueError(f"points: steps {steps[0]}..{steps[-1]} lie outside chunk {chunk}")
    flags = 0
    parts: list[bytes] = []
    if last - first == n - 1:
        flags |= DENSE
        parts.append(_U16.pack(first))
    else:
        parts.append(struct.pack(f"<{n}H", *(s - base for s in steps)))
    if None not in tokens:
        linear = _linear(steps, tokens)
        if linear is not None:
            flags |= TOK_LINEAR
            parts.append(_LINEAR.pack(*linear))
        else:
            parts.append(struct.pack(f"<{n}q", *tokens))
    elif tokens.count(None) == n:
        flags |= TOK_NONE
    else:
        flags |= TOK_MASK
        mask = bytearray(-(-n // 8))
        for i, t in enumerate(tokens):
            if t is None:
                mask[i >> 3] |= 1 << (i & 7)
        parts.append(bytes(mask))
        parts.append(struct.pack(f"<{n}q", *(0 if t is None else t for t in tokens)))
    values = [math.nan if v is None else v for v in raw]
    parts.append(struct.pack(f"<{n}d", *values))
    nonfinite = n - sum(map(math.isfinite, values))
    return _HEAD.pack(VERSION, flags, n) + b"".join(parts), nonfinite


def summary(points: Sequence[Cand]) -> tuple[int | None, float | None, int | None, float | None]:
    """(min step, min value, max step, max value) of a row's points: NaN (None) never wins, the earlier
    step wins a tie; all None for NaN alone (the row columns of revision 0014)."""
    real = [(v, s) for s, _t, v in points if v is not None]
    if not real:
        return None, None, None, None
    lo = min(real)
    hi = min(real, key=lambda p: (-p[0], p[1]))
    return lo[1], lo[0], hi[1], hi[0]


def _linear(steps: Sequence[int], tokens: Sequence[int]) -> tuple[int, int] | None:
    """(t0, dt) when every token is ``t0 + dt * (step - steps[0])`` exactly, dt within int64."""
    t0 = tokens[0]
    if len(tokens) == 1:
        return t0, 0
    dt, rest = divmod(tokens[1] - t0, steps[1] - steps[0])
    if rest or not _I64_MIN <= dt <= _I64_MAX:
        return None
    s0 = steps[0]
    if all(t == t0 + dt * (s - s0) for s, t in zip(steps, tokens)):
        return t0, dt
    return None


def seg_floor(chunk: int) -> int:
    """The first chunk of the segment range holding ``chunk`` (a segment row's key)."""
    return chunk // SEGMENT_CHUNKS * SEGMENT_CHUNKS


def decode(chunk: int, blob: bytes) -> list[Cand]:
    """The points of a chunk or segment row, step-sorted, as ``metric_points`` would give them (NaN -> None)."""
    if segcodec.is_segment(blob):
        return to_cands(*segcodec.decode(chunk * CHUNK_STEPS, blob))
    version, flags, n = _HEAD.unpack_from(blob, 0)
    if version != VERSION:
        raise ValueError(f"metric_chunks.data: unknown format version {version} (this build reads {VERSION})")
    pos = _HEAD.size
    base = chunk * CHUNK_STEPS
    if flags & DENSE:
        first = base + _U16.unpack_from(blob, pos)[0]
        steps: Sequence[int] = range(first, first + n)
        pos += 2
    else:
        steps = [base + o for o in struct.unpack_from(f"<{n}H", blob, pos)]
        pos += 2 * n
    tokens: Sequence[int | None]
    if flags & TOK_NONE:
        tokens = [None] * n
    elif flags & TOK_LINEAR:
        t0, dt = _LINEAR.unpack_from(blob, pos)
        pos += _LINEAR.size
        s0 = steps[0]
        tokens = [t0 + dt * (s - s0) for s in steps]
    else:
        mask = None
        if flags & TOK_MASK:
            mask = blob[pos : pos - (-n // 8)]
            pos -= -n // 8
        tokens = struct.unpack_from(f"<{n}q", blob, pos)
        pos += 8 * n
        if mask is not None:
            tokens = [None if mask[i >> 3] >> (i & 7) & 1 else t for i, t in enumerate(tokens)]
    values = struct.unpack_from(f"<{n}d", blob, pos)
    return [(s, t, None if v != v else v) for s, t, v in zip(steps, tokens, values)]


def to_cands(steps: np.ndarray, tokens: np.ndarray, values: np.ndarray) -> list[Cand]:
    """Columns (NULL_INT, NaN for none) -> (step, tokens or None, value or None) tuples."""
    tok: list[Any] = tokens.tolist()
    if NULL_INT in tok:
        tok = [None if t == NULL_INT else t for t in tok]
    val: list[Any] = values.tolist()
    for i in np.flatnonzero(np.isnan(values)).tolist():
        val[i] = None
    return list(zip(steps.tolist(), tok, val))


def decode_columns(chunk: int, blob: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(steps, tokens with NULL_INT for none, values with NaN) of a chunk or segment row."""
    if segcodec.is_segment(blob):
        return segcodec.decode(chunk * CHUNK_STEPS, blob)
    flags, n = blob[1], _HEAD.unpack_from(blob, 0)[2]
    if flags & DENSE and flags & (TOK_NONE | TOK_LINEAR):  # what training writes: fixed offsets
        first = chunk * CHUNK_STEPS + _U16.unpack_from(blob, _HEAD.size)[0]
        steps = np.arange(first, first + n, dtype=np.int64)
        pos = _HEAD.size + 2
        if flags & TOK_NONE:
            tokens = np.full(n, NULL_INT, dtype=np.int64)
        else:
            t0, dt = _LINEAR.unpack_from(blob, pos)
            pos += _LINEAR.size
            tokens = t0 + dt * (steps - first)
        return steps, tokens, np.frombuffer(blob, "<f8", n, pos).astype(np.float64)
    pts = decode(chunk, blob)
    s, t, v = zip(*pts)
    tok = np.array([NULL_INT if x is None else x for x in t], dtype=np.int64)
    return np.array(s, dtype=np.int64), tok, np.array(v, dtype=np.float64)


_NONE = np.empty(0, dtype=np.int64)


def steps_values(rows: Sequence[tuple[int, bytes]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row index, step, value with NaN) of every point of (chunk, data) rows, in row order and step
    order within a row; tokens are not decoded (:func:`columns_of_rows` without them)."""
    at, steps, _tokens, values = columns_of_rows(rows, tokens=False)
    return at, steps, values


def columns_of_rows(
    rows: Sequence[tuple[int, bytes]], tokens: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(row index, step, tokens with NULL_INT for none, value with NaN) of every point of (chunk, data)
    rows, in row order and step order within a row (``tokens=False``: no tokens decoded, an empty
    array in their place). Each row is decoded once: the 16-step
    chunks of the common layout (consecutive steps, no or linear tokens) of one blob size all at once
    through one numpy record view, any other row through :func:`decode_columns` / ``segcodec``."""
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
    same: dict[tuple[int, int], list[int]] = {}  # (flags, size) -> rows of the common chunk layout
    for i, (chunk, blob) in enumerate(rows):
        if blob[0] == VERSION and blob[1] & DENSE and blob[1] & (TOK_NONE | TOK_LINEAR):
            same.setdefault((blob[1], len(blob)), []).append(i)
            continue
        if segcodec.is_segment(blob) and not tokens:
            steps, values = segcodec.decode_steps_values(chunk * CHUNK_STEPS, blob)
        else:
            steps, toks, values = decode_columns(chunk, blob)
        parts.append((np.full(len(steps), i, dtype=np.int64), steps, toks if tokens else _NONE, values))
    for (flags, size), idx in same.items():
        linear = bool(flags & TOK_LINEAR)
        head = _HEAD.size + 2 + (_LINEAR.size if linear else 0)
        n = (size - head) // 8
        names, formats, offsets = ["first", "values"], ["<u2", ("<f8", n)], [_HEAD.size, head]
        if linear:
            names, formats, offsets = [*names, "t0", "dt"], [*formats, "<i8", "<i8"], [*offsets, head - 16, head - 8]
        layout = np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": size})
        rec = np.frombuffer(b"".join(rows[i][1] for i in idx), layout)
        at = np.asarray(idx, dtype=np.int64)
        base = np.asarray([rows[i][0] for i in idx], dtype=np.int64) * CHUNK_STEPS + rec["first"]
        offset = np.arange(n)
        if not tokens:
            toks = _NONE
        elif linear:
            toks = (rec["t0"][:, None] + rec["dt"][:, None] * offset).ravel()
        else:
            toks = np.full(len(idx) * n, NULL_INT, dtype=np.int64)
        steps = (base[:, None] + offset).ravel()
        parts.append((np.repeat(at, n), steps, toks, rec["values"].astype(np.float64).ravel()))
    if not parts:
        return _NONE, _NONE, _NONE, np.empty(0, dtype=np.float64)
    at, steps, toks, values = (np.concatenate(col) for col in zip(*parts))
    order = np.argsort(at, kind="stable")
    return at[order], steps[order], toks[order] if tokens else _NONE, values[order]


def decode_rows(rows: Iterable[tuple[int, bytes]], lo: int, hi: int) -> list[Cand]:
    """The points within steps [lo, hi] of (chunk, data) rows."""
    out: list[Cand] = []
    for chunk, blob in rows:
        pts = decode(int(chunk), bytes(blob))
        if pts[0][0] >= lo and pts[-1][0] <= hi:
            out += pts
        else:
            out += [p for p in pts if lo <= p[0] <= hi]
    return out


# -- reads of one series (params: run_id, name_id, layer) -----------------------------------------


def _chunk_rows(conn: Connection, params: dict[str, Any], lo: int, hi: int, where: str = "", hint: bool = False) -> Any:
    """Rows of chunks [lo's range start, hi's chunk] in chunk order; ``hint``: SQLite told to read each
    chunk table through its partial index of non-finite rows."""
    cond = f"WHERE {KEY} AND chunk >= :ca AND chunk <= :cb{where}"
    if hint and conn.dialect.name == "sqlite":
        arms = [
            f"SELECT chunk, {toast.data_expr('sqlite')} FROM {t} INDEXED BY ix_{t}_nonfinite {cond}"
            for t in ("metric_chunks", OPEN_CHUNKS)
        ]
        sql = " UNION ALL ".join(arms) + " ORDER BY chunk"
    else:
        sql = f"SELECT chunk, data FROM {CHUNK_ROWS} {cond} ORDER BY chunk"
    return conn.execute(text(sql), {**params, "ca": seg_floor(lo // CHUNK_STEPS), "cb": hi // CHUNK_STEPS})


def chunked_points(conn: Connection, params: dict[str, Any], lo: int, hi: int) -> list[Cand]:
    """The series' points in steps [lo, hi] that live in chunks, step-sorted."""
    return decode_rows(_chunk_rows(conn, params, lo, hi), lo, hi)


def chunked_columns(
    conn: Connection, params: dict[str, Any], lo: int, hi: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(steps, tokens with NULL_INT, values with NaN) of the chunked points in [lo, hi], step-sorted:
    segments decode to columns, no Python object per point (wide raw reads: :mod:`.downsample`)."""
    parts = [decode_columns(int(c), bytes(blob)) for c, blob in _chunk_rows(conn, params, lo, hi)]
    if not parts:
        none = np.empty(0, dtype=np.int64)
        return none, none, np.empty(0, dtype=np.float64)
    steps, tokens, values = (np.concatenate(col) for col in zip(*parts))
    keep = (steps >= lo) & (steps <= hi)
    return steps[keep], tokens[keep], values[keep]


def points(conn: Connection, params: dict[str, Any], lo: int, hi: int) -> list[Cand]:
    """Every point of the series in steps [lo, hi], step-sorted: the chunks' then the hot rows'.

    Chunks hold the steps below the series' sealed boundary and ``metric_points`` the ones above it
    (one writer per series moves them in one transaction), so the two lists never overlap; a reader
    needs one snapshot of both (one statement each in a transaction: see ``managed``).
    """
    out = chunked_points(conn, params, lo, hi)
    hot = hot_relation(conn.dialect.name)
    sql = f"SELECT step, tokens, value FROM {hot} WHERE {KEY} AND step >= :a AND step <= :b ORDER BY step"
    out += [(int(s), t, v) for s, t, v in conn.execute(text(sql), {**params, "a": lo, "b": hi})]
    return out


def end_point(conn: Connection, params: dict[str, Any], first: bool) -> Cand | None:
    """The first (or last) point of the series within params' [start, end]."""
    lo, hi = params["start"], params["end"]
    order = "ASC" if first else "DESC"
    sql = (
        f"SELECT step, tokens, value FROM {hot_relation(conn.dialect.name)} WHERE {KEY} AND step >= :start "
        f"AND step <= :end ORDER BY step {order} LIMIT 1"
    )
    row = conn.execute(text(sql), params).first()
    hot: Cand | None = None if row is None else (int(row[0]), row[1], row[2])
    if hot is not None and not first:
        return hot  # every chunked step lies below every hot step
    # rows in key order, a few at a time: the edge rows may hold no step inside [lo, hi] (a segment
    # starts before lo, a chunk before it in its range lies below lo), a later one then does
    ca, cb = seg_floor(lo // CHUNK_STEPS), hi // CHUNK_STEPS
    while ca <= cb:
        bound = {**params, "ca": ca, "cb": cb}
        sql = (
            f"SELECT chunk, data FROM {CHUNK_ROWS} WHERE {KEY} AND chunk >= :ca AND chunk <= :cb "
            f"ORDER BY chunk {order} LIMIT 4"
        )
        rows = conn.execute(text(sql), bound).all()
        for chunk, blob in rows:
            pts = [p for p in decode(int(chunk), bytes(blob)) if lo <= p[0] <= hi]
            if pts:
                return pts[0] if first else pts[-1]
        if len(rows) < 4:
            break
        if first:
            ca = int(rows[-1][0]) + 1
        else:
            cb = int(rows[-1][0]) - 1
    return hot


def nonfinite(conn: Connection, params: dict[str, Any], lo: int, hi: int) -> list[Cand]:
    """Every NaN/Inf point in [lo, hi]: the hot rows through their partial index, the chunks through theirs.

    SQLite is told to use them (``INDEXED BY``): its planner otherwise walks the clustered primary
    key over the whole range (a 10^7-point series' 625,000 chunks: ~50 ms).
    """
    sqlite = conn.dialect.name == "sqlite"
    hot = hot_relation(conn.dialect.name) + (" INDEXED BY ix_metric_points_nonfinite" if sqlite else "")
    sql = (
        f"SELECT step, tokens, value FROM {hot} WHERE {KEY} AND step >= :lo AND step <= :hi AND ({NONFINITE_PREDICATE})"
    )
    out: list[Cand] = [(int(s), t, v) for s, t, v in conn.execute(text(sql), {**params, "lo": lo, "hi": hi})]
    rows = _chunk_rows(conn, params, lo, hi, where=" AND nonfinite > 0", hint=True)
    out += [p for p in decode_rows(rows, lo, hi) if p[2] is None or not math.isfinite(p[2])]
    return out


# -- reads of many series (the writer's rollups, the detector's windows) --------------------------


def points_in_ranges(
    conn: Connection, run_id: int, ranges: Sequence[tuple[int, int, int, int]]
) -> list[tuple[int, int, int, int | None, float | None]]:
    """(name_id, layer, step, tokens, value) of every point in (name_id, layer, first step, last step) ranges."""
    hot = hot_relation(conn.dialect.name)
    out = list(read_in_ranges(conn, run_id, "t.step, t.tokens, t.value", hot, "step", "", ranges))
    by_chunk = [(n, la, seg_floor(a // CHUNK_STEPS), b // CHUNK_STEPS) for n, la, a, b in ranges]
    found = read_in_ranges(conn, run_id, "t.chunk, t.data", CHUNK_ROWS, "chunk", "", by_chunk)
    bounds: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for n, la, a, b in ranges:
        bounds.setdefault((n, la), []).append((a, b))
    seen: set[tuple[int, int, int]] = set()
    for n, la, chunk, blob in found:
        if (n, la, chunk) in seen:  # two ranges may share a chunk
            continue
        seen.add((n, la, chunk))
        spans = bounds[(n, la)]
        out += [(n, la, *p) for p in decode(int(chunk), bytes(blob)) if any(a <= p[0] <= b for a, b in spans)]
    return out


def all_points(
    conn: Connection, run_id: int | None = None
) -> list[tuple[int, int, int, int, int | None, float | None]]:
    """(run_id, name_id, layer, step, tokens, value) of every stored point (of one run), hot or chunked,
    in key order: what a one-row-per-point table would hold (for checks, exports and migrations: before
    revision 0015 every chunk row is in ``metric_chunks``)."""
    relation = CHUNK_ROWS if CHUNK_ROWS in inspect(conn).get_view_names() else "metric_chunks"
    where, params = ("", {}) if run_id is None else (" WHERE run_id = :r", {"r": run_id})
    out = [
        (int(r), int(n), int(la), int(s), t, v)
        for r, n, la, s, t, v in conn.execute(
            text(f"SELECT run_id, name_id, layer, step, tokens, value FROM {hot_relation(conn.dialect.name)}{where}"),
            params,
        )
    ]
    for r, n, la, c, blob in conn.execute(
        text(f"SELECT run_id, name_id, layer, chunk, data FROM {relation}{where}"), params
    ):
        out += [(int(r), int(n), int(la), *p) for p in decode(int(c), bytes(blob))]
    out.sort(key=lambda p: p[:4])
    return out
