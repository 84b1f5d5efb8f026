"""Writing metric points: upsert, rollups, the latest-value table and batch idempotency.

Semantics (also stated in the API docs):
- a batch_id already stored is a no-op (the reply says ``duplicate: true``);
- the key of a point is (run, name, layer, step); a key sent again overwrites the stored value and
  tokens: **last write wins** (a re-sent step is a correction, e.g. a replayed spool after a crash);
- within one batch the last occurrence of a key wins.

Rollups: after the points of a batch are written, every touched block of every level is recomputed
from the level below (level 1 from the points), reading only the touched block ranges, so a batch
costs O(points + 16 x touched blocks) and overwrites keep rollups exact.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import case, insert, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from hooks.schema import Point
from monitor.store.models import (
    ROLLUP_LEVELS,
    RUN_LEVEL_LAYER,
    IngestedBatchRow,
    MetricPointRow,
    MetricRollupRow,
    RunRow,
    SeriesLatestRow,
)

SeriesKey = tuple[int, int]  # (name_id, layer)
Acc = list[Any]  # [n, min_step, min_tokens, min_value, max_step, max_tokens, max_value]


def now_utc() -> datetime:
    return datetime.now(UTC)


def as_utc(ts: datetime | None) -> datetime | None:
    """SQLite returns naive datetimes; every timestamp stored is UTC."""
    if ts is None:
        return None
    return ts if ts.tzinfo is not None else ts.replace(tzinfo=UTC)


def to_sql_value(value: float) -> float | None:
    """NaN -> NULL; +-Inf and finite values as themselves (see models.py)."""
    return None if math.isnan(value) else value


def from_sql_value(value: float | None) -> float:
    return math.nan if value is None else float(value)


def sql_layer(layer: int | None) -> int:
    return RUN_LEVEL_LAYER if layer is None else layer


def api_layer(layer: int) -> int | None:
    return None if layer == RUN_LEVEL_LAYER else layer


def dialect_insert(conn: Connection, table: Any) -> Any:
    if conn.dialect.name == "postgresql":
        return postgresql.insert(table)
    return sqlite.insert(table)


def batch_seen(conn: Connection, batch_id: str) -> int | None:
    """The point count of an already stored batch, or None."""
    found = conn.execute(select(IngestedBatchRow.n_points).where(IngestedBatchRow.batch_id == batch_id)).first()
    return None if found is None else int(found[0])


def write_points(
    conn: Connection, run_id: int, batch_id: str, points: Sequence[Point], name_ids: dict[str, int]
) -> None:
    now = datetime.now(UTC)
    conn.execute(
        insert(IngestedBatchRow).values(batch_id=batch_id, run_id=run_id, n_points=len(points), received_at=now)
    )
    if not points:
        return
    rows: dict[tuple[int, int, int], dict[str, Any]] = {}
    for p in points:
        key = (name_ids[p.name], sql_layer(p.layer), p.step)
        rows[key] = {
            "run_id": run_id,
            "name_id": key[0],
            "layer": key[1],
            "step": p.step,
            "tokens": p.tokens,
            "value": to_sql_value(p.value),
        }
    conn.execute(_upsert(conn.dialect.name, "metric_points"), list(rows.values()))
    touched: dict[SeriesKey, set[int]] = defaultdict(set)
    latest: dict[SeriesKey, dict[str, Any]] = {}
    for (name_id, layer, step), row in rows.items():
        touched[(name_id, layer)].add(step)
        if (name_id, layer) not in latest or step >= latest[(name_id, layer)]["step"]:
            latest[(name_id, layer)] = row
    _write_latest(conn, run_id, latest)
    refresh_rollups(conn, run_id, touched)
    max_step = max(p.step for p in points)
    conn.execute(
        update(RunRow)
        .where(RunRow.id == run_id)
        .values(
            last_point_at=now,
            last_step=case(
                (RunRow.last_step.is_(None), max_step),
                (RunRow.last_step < max_step, max_step),
                else_=RunRow.last_step,
            ),
        )
    )


def _write_latest(conn: Connection, run_id: int, latest: dict[SeriesKey, dict[str, Any]]) -> None:
    conn.execute(
        _upsert(conn.dialect.name, "series_latest"),
        [
            {"run_id": run_id, "name_id": k[0], "layer": k[1], "step": r["step"], "value": r["value"]}
            for k, r in latest.items()
        ],
    )


def _ranges(blocks: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted block numbers -> inclusive runs of consecutive numbers."""
    out: list[tuple[int, int]] = []
    for b in sorted(set(blocks)):
        if out and b == out[-1][1] + 1:
            out[-1] = (out[-1][0], b)
        else:
            out.append((b, b))
    return out


def _fold(acc: Acc | None, n: int, lo: tuple[Any, Any, Any], hi: tuple[Any, Any, Any]) -> Acc:
    """Merge a (count, min point, max point) into an accumulator; NULL values (NaN) never win."""
    if acc is None:
        acc = [0, None, None, None, None, None, None]
    acc[0] += n
    if lo[2] is not None and (acc[3] is None or lo[2] < acc[3]):
        acc[1], acc[2], acc[3] = lo
    if hi[2] is not None and (acc[6] is None or hi[2] > acc[6]):
        acc[4], acc[5], acc[6] = hi
    return acc


_POINTS_IN = text(
    "SELECT step, tokens, value FROM metric_points "
    "WHERE run_id = :r AND name_id = :n AND layer = :l AND step >= :a AND step < :b"
)
_ROLLUPS_IN = text(
    "SELECT block, n_points, min_step, min_tokens, min_value, max_step, max_tokens, max_value "
    "FROM metric_rollups WHERE run_id = :r AND name_id = :n AND layer = :l AND level = :v "
    "AND block >= :a AND block < :b"
)
_ROLLUP_COLS = ("n_points", "min_step", "min_tokens", "min_value", "max_step", "max_tokens", "max_value")


@lru_cache(maxsize=8)
def _upsert(dialect: str, table_name: str) -> Any:
    """The cached ON CONFLICT DO UPDATE statement of a table (built once per dialect)."""
    mod: Any = postgresql if dialect == "postgresql" else sqlite
    if table_name == "metric_points":
        ins = mod.insert(MetricPointRow.__table__)
        return ins.on_conflict_do_update(
            index_elements=["run_id", "name_id", "layer", "step"],
            set_={"tokens": ins.excluded.tokens, "value": ins.excluded.value},
        )
    if table_name == "series_latest":
        table = SeriesLatestRow.__table__
        ins = mod.insert(table)
        return ins.on_conflict_do_update(
            index_elements=["run_id", "name_id", "layer"],
            set_={"step": ins.excluded.step, "value": ins.excluded.value},
            where=ins.excluded.step >= table.c.step,
        )
    ins = mod.insert(MetricRollupRow.__table__)
    return ins.on_conflict_do_update(
        index_elements=["run_id", "name_id", "layer", "level", "block"],
        set_={c: ins.excluded[c] for c in _ROLLUP_COLS},
    )


def refresh_rollups(conn: Connection, run_id: int, touched: dict[SeriesKey, set[int]]) -> None:
    """Recompute the rollup blocks containing ``touched`` steps, level by level."""
    prev_width = 1
    for level, width in ROLLUP_LEVELS.items():
        out_rows: list[dict[str, Any]] = []
        ratio = width // prev_width
        for (name_id, layer), steps in touched.items():
            key = {"r": run_id, "n": name_id, "l": layer}
            for b0, b1 in _ranges(s // width for s in steps):
                accs: dict[int, Acc] = {}
                if level == 1:
                    rows = conn.execute(_POINTS_IN, {**key, "a": b0 * width, "b": (b1 + 1) * width})
                    for step, tokens, value in rows:
                        pt = (step, tokens, value)
                        accs[step // width] = _fold(accs.get(step // width), 1, pt, pt)
                else:
                    rows = conn.execute(_ROLLUPS_IN, {**key, "v": level - 1, "a": b0 * ratio, "b": (b1 + 1) * ratio})
                    for blk, n, s0, t0, v0, s1, t1, v1 in rows:
                        accs[blk // ratio] = _fold(accs.get(blk // ratio), n, (s0, t0, v0), (s1, t1, v1))
                for block, a in accs.items():
                    out_rows.append(
                        {
                            "run_id": run_id,
                            "name_id": name_id,
                            "layer": layer,
                            "level": level,
                            "block": block,
                            **dict(zip(_ROLLUP_COLS, a)),
                        }
                    )
        if out_rows:
            conn.execute(_upsert(conn.dialect.name, "metric_rollups"), out_rows)
        prev_width = width
