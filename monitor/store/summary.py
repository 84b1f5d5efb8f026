"""Run-level series summed up for the runs table: latest point, smallest and largest value with their steps.

:meth:`SummaryMixin.series_summaries` is the one read of a series' extremes by the runs table
(``GET /api/v1/runs?summary=loss,val_loss``); its contract is in :meth:`monitor.store.base.Store.series_summaries`.
How it reads, in one statement on both databases, without reading every point:

- the latest step and value come from ``series_latest`` (one row per series, NaN as NULL), merged with the
  run's pending points (:mod:`.latest`);
- the extremes come from the rows that cover the series without overlap, the same nesting
  :mod:`monitor.store.learning` reads peaks by: every level-3 (4,096-step) rollup row, the level-2
  (1,024-step, one per segment) rows after the last sealed level-3 block, then the open segment range's
  ``metric_chunks`` rows (a partial segment and at most 15 chunks of 16 steps), each with its own
  extremes (``min_step``, ``min_value``, ``max_step``, ``max_value``, revision 0014), and the hot
  points after them. Every such row keeps the step of its minimum and of its maximum (NaN never
  wins, +-Inf compete, the earlier step wins a tie), so the extremes and their steps are exact;
- ``row_number()`` over each series keeps the smallest (then earliest) and the largest (then
  earliest) of those rows, so the database sends back one row per series.

For whoever changes the storage format again: this module is the only reader of extremes for the
runs table. The hot-tail boundary (:func:`_tail_start`) and the covering rows (:func:`_covering`) must
follow the format, and ``tests/monitor/api/test_run_summary.py`` (extremes placed in every level and
the tail, checked against every point on SQLite and PostgreSQL) must keep passing.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from sqlalchemy import bindparam, select, text
from sqlalchemy.engine import Engine

from hyperwatch.monitor.store.engine import managed
from hyperwatch.monitor.store.entities import SeriesSummary
from hyperwatch.monitor.store.latest import newest_pending, overlay
from hyperwatch.monitor.store.models import (
    CHUNK_STEPS,
    CHUNK_TABLES,
    ROLLUP_LEVELS,
    RUN_LEVEL_LAYER,
    MetricNameRow,
    hot_relation,
)
from hyperwatch.monitor.store.points import from_sql_value

RUNS_PER_READ = 500
"""Run ids per statement (SQLite's bound-parameter limit stays far away)."""


def _covering() -> str:
    """The rollup rows ``r`` of a series (its ``series_latest`` row ``s``) that cover its sealed
    steps once: the coarsest level whole, each finer level after the coarser one's last sealed block."""
    levels = sorted(ROLLUP_LEVELS)
    parts = [f"r.level = {levels[-1]}"]
    for finer, coarser in itertools.pairwise(levels):
        per = ROLLUP_LEVELS[coarser] // ROLLUP_LEVELS[finer]
        parts.append(f"(r.level = {finer} AND r.block >= ((s.step + 1) / {ROLLUP_LEVELS[coarser]}) * {per})")
    return " OR ".join(parts)


def _open_range() -> str:
    """The first chunk of the series' open segment range (revision 0014): no rollup row covers its
    ``metric_chunks`` rows (a partial segment, 16-step chunks), each keeps its own extremes."""
    finest = ROLLUP_LEVELS[min(ROLLUP_LEVELS)]
    return f"((s.step + 1) / {finest}) * {finest // CHUNK_STEPS}"


def _tail_start() -> str:
    """The first step no rollup row covers yet: the end of the last sealed block of the finest level."""
    finest = ROLLUP_LEVELS[min(ROLLUP_LEVELS)]
    return f"((s.step + 1) / {finest}) * {finest}"


def _chunk_arm(table: str) -> str:
    return f"""  SELECT k.run_id, k.name_id, k.min_value, k.min_step, k.max_value, k.max_step
  FROM {table} k JOIN s ON k.run_id = s.run_id AND k.name_id = s.name_id AND k.layer = s.layer
  WHERE k.min_value IS NOT NULL AND k.chunk >= {_open_range()}
  UNION ALL
"""


def _summaries_sql(dialect: str) -> Any:
    sql = f"""
WITH s AS (
  SELECT run_id, name_id, layer, step, value FROM series_latest
  WHERE run_id IN :runs AND name_id IN :names AND layer = :layer
),
c AS (
  SELECT r.run_id, r.name_id, r.min_value AS lo, r.min_step AS lo_step, r.max_value AS hi, r.max_step AS hi_step
  FROM metric_rollups r JOIN s ON r.run_id = s.run_id AND r.name_id = s.name_id AND r.layer = s.layer
  WHERE r.min_value IS NOT NULL AND ({_covering()})
  UNION ALL
{"".join(_chunk_arm(table) for table in CHUNK_TABLES)}
  SELECT h.run_id, h.name_id, h.value, h.step, h.value, h.step
  FROM {hot_relation(dialect)} h JOIN s ON h.run_id = s.run_id AND h.name_id = s.name_id AND h.layer = s.layer
  WHERE h.value IS NOT NULL AND h.step >= {_tail_start()}
),
ranked AS (
  SELECT run_id, name_id, lo, lo_step, hi, hi_step,
    row_number() OVER (PARTITION BY run_id, name_id ORDER BY lo, lo_step) AS lo_rank,
    row_number() OVER (PARTITION BY run_id, name_id ORDER BY hi DESC, hi_step) AS hi_rank
  FROM c
)
SELECT s.run_id, s.name_id, s.step, s.value, a.lo, a.lo_step, b.hi, b.hi_step
FROM s
LEFT JOIN ranked a ON a.run_id = s.run_id AND a.name_id = s.name_id AND a.lo_rank = 1
LEFT JOIN ranked b ON b.run_id = s.run_id AND b.name_id = s.name_id AND b.hi_rank = 1"""
    return text(sql).bindparams(bindparam("runs", expanding=True), bindparam("names", expanding=True))


def _number(value: Any) -> float | None:
    return None if value is None else float(value)


class SummaryMixin:
    """SqlStore's :meth:`series_summaries`."""

    engine: Engine

    def series_summaries(self, run_ids: Sequence[int], names: Sequence[str]) -> dict[tuple[int, str], SeriesSummary]:
        runs = list(dict.fromkeys(int(r) for r in run_ids))
        wanted = list(dict.fromkeys(names))
        if not runs or not wanted:
            return {}
        out: dict[tuple[int, str], SeriesSummary] = {}
        with managed(self.engine, f"read the summaries of {len(runs)} runs") as conn:
            found = conn.execute(select(MetricNameRow.id, MetricNameRow.name).where(MetricNameRow.name.in_(wanted)))
            ids = {int(i): str(n) for i, n in found}
            if not ids:
                return {}
            statement = _summaries_sql(conn.dialect.name)
            for start in range(0, len(runs), RUNS_PER_READ):
                chunk = runs[start : start + RUNS_PER_READ]
                params = {"runs": chunk, "names": list(ids), "layer": RUN_LEVEL_LAYER}
                newest = newest_pending(conn, chunk, ids)
                for run_id, name_id, step, value, lo, lo_step, hi, hi_step in conn.execute(statement, params):
                    step, value = overlay((run_id, name_id, RUN_LEVEL_LAYER), step, value, newest)
                    low, high = _number(lo), _number(hi)
                    out[(int(run_id), ids[int(name_id)])] = SeriesSummary(
                        last_step=int(step),
                        last=from_sql_value(value),
                        min=low,
                        min_step=None if low is None else int(lo_step),
                        max=high,
                        max_step=None if high is None else int(hi_step),
                    )
        return out
