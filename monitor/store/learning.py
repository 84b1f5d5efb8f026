"""The reads a group's learned thresholds come from (policy in :mod:`monitor.thresholds.learned`), and their write.

- :meth:`LearningMixin.group_run_health`: each run of the group, its status, its last loss (from
  ``series_latest``), whether it is archived and the kinds of incident it has (rule, severity): two
  small reads.
- :meth:`LearningMixin.series_peaks`: each run's highest finite value per metric name, over every
  layer and step, from the rollups, not the points. A rollup row holds the max of its block, and the
  blocks of the levels nest (1,024 and 4,096 steps since revision 0014), so a series' max is the max
  over its level-3 rows, the level-2 rows after the last sealed level-3 block, the ``metric_chunks``
  rows of its open segment range (each keeps its max: a partial segment and up to 15 chunks; the
  boundaries from ``series_latest``: a block is sealed once the latest step reaches its end,
  :mod:`monitor.store.rollups`), and the hot points (reading all of them is harmless, a max is a
  max). About 20 rows per series plus one per 4096 steps, in one statement, on both databases. A block whose max is
  +-Inf is left out (its finite values are not in the rollup): such a run raised a
  ``nonfinite_value`` incident and is not learned from anyway.
- :meth:`LearningMixin.save_learned`: the group row's ``learned`` (migration 0010), kept when what it
  holds was read later than this (two runs finishing at once: the later read stands).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import bindparam, or_, select, text, update
from sqlalchemy.engine import Connection, Engine

from hyperwatch.hooks.schema import base_name
from hyperwatch.monitor.core.errors import NotFoundError
from hyperwatch.monitor.store.alert_models import IncidentRow
from hyperwatch.monitor.store.engine import managed, retry_busy
from hyperwatch.monitor.store.entities import RunHealth
from hyperwatch.monitor.store.latest import newest_pending, overlay
from hyperwatch.monitor.store.models import (
    CHUNK_STEPS,
    CHUNK_TABLES,
    ROLLUP_LEVELS,
    RUN_LEVEL_LAYER,
    SEGMENT_STEPS,
    GroupRow,
    MetricNameRow,
    RunRow,
    SeriesLatestRow,
    hot_relation,
)
from hyperwatch.monitor.store.points import from_sql_value

BIG = 1.7976931348623157e308
"""The largest double: ``value <= BIG AND value >= -BIG`` is finite (NaN is NULL here)."""


def _rollup_levels_sql() -> str:
    """Which rollup rows of a series (``r``, its ``series_latest`` row ``s``) cover it without overlap."""
    levels = sorted(ROLLUP_LEVELS)
    parts = [f"r.level = {levels[-1]}"]
    for level, coarser in itertools.pairwise(levels):
        ratio = ROLLUP_LEVELS[coarser] // ROLLUP_LEVELS[level]
        parts.append(f"(r.level = {level} AND r.block >= ((s.step + 1) / {ROLLUP_LEVELS[coarser]}) * {ratio})")
    return " OR ".join(parts)


def _open_range_sql() -> str:
    """The first chunk of a series' open segment range (``s``: its ``series_latest`` row): the rows from
    there on (a partial segment, 16-step chunks) are covered by no rollup; their own max is read."""
    return f"((s.step + 1) / {SEGMENT_STEPS}) * {SEGMENT_STEPS // CHUNK_STEPS}"


def _peaks_sql(dialect: str) -> Any:
    sql = (
        "SELECT r.run_id, r.name_id, max(r.max_value) FROM metric_rollups r JOIN series_latest s "
        "ON s.run_id = r.run_id AND s.name_id = r.name_id AND s.layer = r.layer "
        "WHERE r.run_id IN :runs AND r.name_id IN :names AND r.max_value <= :big AND r.max_value >= -:big "
        f"AND ({_rollup_levels_sql()}) GROUP BY r.run_id, r.name_id "
        + "".join(
            f"UNION ALL SELECT c.run_id, c.name_id, max(c.max_value) FROM {table} c JOIN series_latest s "
            "ON s.run_id = c.run_id AND s.name_id = c.name_id AND s.layer = c.layer "
            "WHERE c.run_id IN :runs AND c.name_id IN :names AND c.max_value <= :big AND c.max_value >= -:big "
            f"AND c.chunk >= {_open_range_sql()} GROUP BY c.run_id, c.name_id "
            for table in CHUNK_TABLES
        )
        + f"UNION ALL SELECT run_id, name_id, max(value) FROM {hot_relation(dialect)} "
        "WHERE run_id IN :runs AND name_id IN :names AND value <= :big AND value >= -:big GROUP BY run_id, name_id"
    )
    return text(sql).bindparams(bindparam("runs", expanding=True), bindparam("names", expanding=True))


class LearningMixin:
    """SqlStore's reads and write for learned thresholds."""

    engine: Engine

    if TYPE_CHECKING:

        def _name_id(self, conn: Connection, name: str, create: bool = True) -> int | None: ...

    def group_run_health(self, group_id: int) -> list[RunHealth]:
        with managed(self.engine, f"read the runs of group {group_id}") as conn:
            if conn.execute(select(GroupRow.id).where(GroupRow.id == group_id)).scalar() is None:
                raise NotFoundError(f"group id {group_id} not found; list groups with GET /api/v1/groups")
            loss_id = self._name_id(conn, "loss", create=False)
            nid = -1 if loss_id is None else loss_id
            latest = select(SeriesLatestRow.run_id, SeriesLatestRow.step, SeriesLatestRow.value).where(
                SeriesLatestRow.name_id == nid,
                SeriesLatestRow.layer == RUN_LEVEL_LAYER,
            )
            loss = latest.subquery()
            losses = conn.execute(
                select(RunRow.id, RunRow.name, RunRow.status, loss.c.run_id, loss.c.step, loss.c.value, RunRow.archived)
                .outerjoin(loss, loss.c.run_id == RunRow.id)
                .where(RunRow.group_id == group_id)
                .order_by(RunRow.id)
            ).all()
            # each run's latest loss: its row merged with its pending points (monitor.store.latest)
            newest = newest_pending(conn, [r[0] for r in losses], [nid])
            rows = [
                (
                    rid,
                    name,
                    status,
                    has,
                    v if has is None else overlay((rid, nid, RUN_LEVEL_LAYER), s, v, newest)[1],
                    a,
                )
                for rid, name, status, has, s, v, a in losses
            ]
            kinds: dict[int, list[tuple[str, str]]] = {}
            found = conn.execute(
                select(IncidentRow.run_id, IncidentRow.rule, IncidentRow.severity)
                .where(IncidentRow.run_id.in_(select(RunRow.id).where(RunRow.group_id == group_id)))
                .distinct()
                .order_by(IncidentRow.run_id, IncidentRow.rule, IncidentRow.severity)
            )
            for run_id, rule, severity in found:
                kinds.setdefault(run_id, []).append((rule, severity))
        return [
            RunHealth(
                id=r[0],
                name=r[1],
                status=r[2],
                last_loss=None if r[3] is None else from_sql_value(r[4]),
                incidents=tuple(kinds.get(r[0], ())),
                archived=bool(r[5]),
            )
            for r in rows
        ]

    def series_peaks(self, run_ids: Sequence[int], bases: Sequence[str]) -> dict[tuple[int, str], float]:
        if not run_ids or not bases:
            return {}
        wanted = set(bases)
        with managed(self.engine, f"read the peaks of {len(run_ids)} runs") as conn:
            like = [MetricNameRow.name.like(f"{b}.%") for b in wanted]
            candidates = conn.execute(
                select(MetricNameRow.id, MetricNameRow.name).where(or_(MetricNameRow.name.in_(wanted), *like))
            ).all()
            names = {int(i): n for i, n in candidates if base_name(n) in wanted}
            if not names:
                return {}
            params = {"runs": list(run_ids), "names": list(names), "big": BIG}
            peaks: dict[tuple[int, str], float] = {}
            for run_id, name_id, value in conn.execute(_peaks_sql(conn.dialect.name), params):
                if value is None or not math.isfinite(value):
                    continue
                key = (int(run_id), names[int(name_id)])
                peaks[key] = max(float(value), peaks.get(key, -math.inf))
        return peaks

    @retry_busy
    def save_learned(self, group_id: int, learned: dict[str, Any], read_at: float) -> bool:
        with managed(self.engine, f"store what group {group_id} learned", write=True) as conn:
            held = conn.execute(select(GroupRow.learned).where(GroupRow.id == group_id).with_for_update()).first()
            if held is None:
                raise NotFoundError(f"group id {group_id} not found; list groups with GET /api/v1/groups")
            old = held[0]
            if isinstance(old, dict) and isinstance(old.get("read_at"), (int, float)) and old["read_at"] > read_at:
                return False
            conn.execute(
                update(GroupRow).where(GroupRow.id == group_id).values(learned={**learned, "read_at": read_at})
            )
            return True
