"""SqlStore's point, alert and export methods (a mixin; the class is :class:`monitor.store.sql.SqlStore`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import bindparam, select
from sqlalchemy.engine import Connection, Engine

from hyperwatch.hooks.columns import PointColumns
from hyperwatch.hooks.schema import Point
from hyperwatch.monitor.core.errors import NotFoundError
from hyperwatch.monitor.store import cardinality, incidents, matrix, tail
from hyperwatch.monitor.store import downsample as ds
from hyperwatch.monitor.store.alert_models import AlertEventRow, run_scoped
from hyperwatch.monitor.store.base import Detector, DetectorFor
from hyperwatch.monitor.store.engine import managed, retry_busy
from hyperwatch.monitor.store.entities import (
    ACTIVE_STATUS,
    ActiveRun,
    Alert,
    IngestResult,
    LatestValue,
    LayerMatrix,
    NewAlert,
    Run,
    Series,
    SeriesInfo,
    SeriesPoint,
)
from hyperwatch.monitor.store.held import HeldPoints
from hyperwatch.monitor.store.hot import HotVacuum
from hyperwatch.monitor.store.ingest import Duplicate, LatestSteps, lock_run, new_token, store_points
from hyperwatch.monitor.store.latest import latest_steps, newest_pending, overlay
from hyperwatch.monitor.store.models import MetricNameRow, ProjectRow, RunRow, SeriesLatestRow
from hyperwatch.monitor.store.names import check_name_count
from hyperwatch.monitor.store.points import (
    CODE_LAYER_BITS,
    SortedBatch,
    api_layer,
    as_utc,
    dialect_insert,
    from_sql_value,
    layer_of,
    now_utc,
    sql_layer,
    to_sql_value,
)
from hyperwatch.monitor.store.trailing import max_by_step, per_step_max, trailing_points

_ALERT_ROWS = 1000  # rows per INSERT: 11 values each stays under SQLite's 32,766 bound parameters


def _alert_key(a: NewAlert) -> tuple[str, str, int, int]:
    return (a.rule, a.name, sql_layer(a.layer), a.step)


_SERIES_OF_RUN = (
    select(
        MetricNameRow.name, SeriesLatestRow.layer, SeriesLatestRow.step, SeriesLatestRow.value, SeriesLatestRow.name_id
    )
    .join(MetricNameRow, MetricNameRow.id == SeriesLatestRow.name_id)
    .where(SeriesLatestRow.run_id == bindparam("run_id"))
    .order_by(MetricNameRow.name, SeriesLatestRow.layer)
)
"""A run's latest value of each series as ``series_latest`` holds it, built once (the live pages ask for
it on every logged step); merged with the run's pending points before use (:mod:`.latest`)."""

_RUN_HEADS = select(RunRow.id, RunRow.last_step, RunRow.status).where(
    RunRow.id.in_(bindparam("run_ids", expanding=True))
)
_RUN_HEAD = select(RunRow.last_step, RunRow.ingest_token).where(RunRow.id == bindparam("run_id"))


class _ConnWindows:
    """A :class:`WindowReader` reading inside an open transaction (it sees the batch being stored)."""

    def __init__(self, store: SeriesMixin, conn: Connection) -> None:
        self._store, self._conn = store, conn

    def trailing_windows(
        self, run_id: int, keys: Sequence[tuple[str, int | None, int]], limit: int
    ) -> list[list[float]]:
        return [[v for _step, v in w] for w in self.trailing_points(run_id, keys, limit)]

    def trailing_points(
        self, run_id: int, keys: Sequence[tuple[str, int | None, int]], limit: int
    ) -> list[list[tuple[int, float]]]:
        if not keys:
            return []
        return self._store._trailing_points(self._conn, run_id, keys, limit)


class SeriesMixin:
    """Needs ``engine``, ``_name_id``, ``_name_ids`` and ``_get_run`` from the class it is mixed into."""

    engine: Engine
    hot_vacuum: HotVacuum
    latest_steps: LatestSteps
    held_points: HeldPoints
    series_limits: cardinality.SeriesLimits
    _name_ids: dict[str, int]

    if TYPE_CHECKING:  # provided by SqlStore

        def _name_id(self, conn: Connection, name: str, create: bool = True) -> int | None: ...

        def _get_run(self, conn: Connection, run_id: int) -> Run: ...

        def _names_by_id(self) -> dict[int, str]: ...

    # -- points ----------------------------------------------------------------------------------
    def ingest(
        self, run_id: int, batch_id: str, points: Sequence[Point] | PointColumns, detector: Detector | None = None
    ) -> IngestResult:
        return self._ingest(run_id, f"run {run_id}", batch_id, points, lambda _r, _t: detector)

    def ingest_named(
        self,
        project: str,
        run: str,
        batch_id: str,
        points: Sequence[Point] | PointColumns,
        detector_for: DetectorFor | None = None,
    ) -> IngestResult:
        return self._ingest((project, run), f"run {project}/{run}", batch_id, points, detector_for)

    @retry_busy
    def _ingest(
        self,
        run: int | tuple[str, str],
        what: str,
        batch_id: str,
        points: Sequence[Point] | PointColumns,
        detector_for: DetectorFor | None,
    ) -> IngestResult:
        """One transaction (:mod:`monitor.store.ingest`): the run's row locked, the batch id claimed, the
        points written, the alerts stored. A duplicate batch id rolls back and changes nothing."""
        columns = PointColumns.of(points)
        check_name_count(len(columns.names))  # before any work: a refused batch allocates nothing
        top = int(columns.step.max()) if len(columns) else None
        moved, committed = 0, None
        try:
            with managed(self.engine, f"store batch {batch_id} of {what}", write=True) as conn:
                token = new_token()
                run_id, prior, group, running, seen = lock_run(conn, run, top, token, batch_id, len(columns))
                if seen is not None:
                    raise Duplicate(run_id, seen)
                alerts: list[NewAlert] = []
                if len(columns):
                    known = self.latest_steps.get(run_id, prior) or latest_steps(conn, run_id)
                    # the limits before any name is registered (monitor.store.cardinality): a refused batch
                    # rolls back having drawn no name id, counted nothing and stored nothing
                    ids = cardinality.admit(conn, run_id, what, columns, known[0], self._name_ids, self.series_limits)
                    batch = SortedBatch.of(columns, ids)
                    held = self.held_points if conn.dialect.name == "sqlite" else None
                    if not running:  # its last steps put back where the writers expect them (store.tail)
                        mine = {c: known[0][c] for c in batch.codes.tolist() if c in known[0]}
                        tail.unfold(conn, run_id, mine, new_token=False)
                    moved, committed = store_points(conn, self.latest_steps, run_id, token, batch, known, held, prior)
                    if not running:  # points after the run stopped: its open ranges packed again (0015)
                        tail.seal_stopped(conn, run_id, fold=False)
                detector = None if detector_for is None else detector_for(run_id, group)
                if detector is not None:
                    # same transaction: the batch and its alerts commit together or not at all (a retried
                    # batch is then either a duplicate with its alerts stored, or new and detected again)
                    alerts = self._insert_alerts(conn, run_id, detector(_ConnWindows(self, conn)))
        except Duplicate as dup:
            return IngestResult(run_id=dup.run_id, accepted=dup.accepted, duplicate=True)
        if committed is not None:
            committed()
        self.hot_vacuum.moved(moved)  # committed: the rows it deleted can be vacuumed
        return IngestResult(run_id=run_id, accepted=len(columns), duplicate=False, alerts=tuple(alerts))

    def _series_params(self, conn: Connection, run_id: int, name: str, layer: int | None) -> dict[str, Any] | None:
        self._get_run(conn, run_id)
        nid = self._name_id(conn, name, create=False)
        if nid is None:
            return None
        return {"run_id": run_id, "name_id": nid, "layer": sql_layer(layer)}

    def series(
        self, run_id: int, name: str, layer: int | None, buckets: int, start: int | None, end: int | None
    ) -> Series:
        with managed(self.engine, f"read series {name} of run {run_id}") as conn:
            params = self._series_params(conn, run_id, name, layer)
            found = None
            if params is not None:
                params.update(start=0 if start is None else start, end=2**62 if end is None else end)
                found = ds.downsample(conn, params, buckets)
            pts = [] if found is None else [SeriesPoint(s, t, from_sql_value(v)) for s, t, v in found[0]]
            return Series(run_id, name, layer, pts, bool(found and found[1]), buckets)

    def layer_matrix(self, run_id: int, name: str, buckets: int, start: int | None, end: int | None) -> LayerMatrix:
        with managed(self.engine, f"read layer matrix {name} of run {run_id}") as conn:
            self._get_run(conn, run_id)
            nid = self._name_id(conn, name, create=False)
            latest: dict[int, int] = {}
            if nid is not None:
                found = conn.execute(
                    select(SeriesLatestRow.layer, SeriesLatestRow.step).where(
                        SeriesLatestRow.run_id == run_id, SeriesLatestRow.name_id == nid, SeriesLatestRow.layer >= 0
                    )
                )
                newest = newest_pending(conn, [run_id], [nid])
                latest = {int(la): overlay((run_id, nid, int(la)), int(s), None, newest)[0] for la, s in found}
            base = {"run_id": run_id, "name_id": nid, "start": start or 0, "end": 2**62 if end is None else end}
            read = matrix.read(conn, base, latest, buckets)
            if read is None:
                return LayerMatrix(run_id, name, [], [], 1, [])
            lo, w, n, rows = read
            return LayerMatrix(run_id, name, sorted(latest), [lo + i * w for i in range(n)], w, rows)

    def list_series(
        self, run_id: int, limit: int | None = None, after: tuple[str, int | None] | None = None
    ) -> list[SeriesInfo]:
        """At most ``limit`` series (default: the per-run series limit, so even a run flooded before the
        limit existed is read in bounded time and memory), those after ``after`` (name, layer) in order."""
        size = self.series_limits.per_run if limit is None else limit
        q = _SERIES_OF_RUN
        if after is not None:
            name, layer = after[0], sql_layer(after[1])
            q = q.where((MetricNameRow.name > name) | ((MetricNameRow.name == name) & (SeriesLatestRow.layer > layer)))
        with managed(self.engine, f"list series of run {run_id}") as conn:
            self._get_run(conn, run_id)
            rows = conn.execute(q.limit(size), {"run_id": run_id}).all()
            newest = newest_pending(conn, [run_id], {int(r[4]) for r in rows})
            out = []
            for n, la, s, v, nid in rows:
                s, v = overlay((run_id, nid, la), s, v, newest)
                out.append(SeriesInfo(n, api_layer(la), s, from_sql_value(v)))
            return out

    def run_heads(self, run_ids: Sequence[int]) -> dict[int, tuple[int | None, str]]:
        with managed(self.engine, f"read the progress of runs {list(run_ids)[:10]}") as conn:
            return {rid: (last, status) for rid, last, status in conn.execute(_RUN_HEADS, {"run_ids": list(run_ids)})}

    def newest_points(self, run_id: int, step: int) -> list[tuple[str, int | None, float]] | None:
        with managed(self.engine, f"read the newest points of run {run_id}") as conn:
            head = conn.execute(_RUN_HEAD, {"run_id": run_id}).first()
            if head is None:
                raise NotFoundError(f"run id {run_id} not found; list runs with GET /api/v1/runs")
            if head.last_step != step:
                return None
            # what this process recorded with the token the run's row holds is series_latest now
            cached = self.latest_steps.newest(run_id, int(head.ingest_token), step)
            names = self._names_by_id() if cached else {}
            if cached is not None and all(code >> CODE_LAYER_BITS in names for code, _v in cached):
                found = [(names[code >> CODE_LAYER_BITS], layer_of(code), v) for code, v in cached]
                found.sort(key=lambda p: (p[0], p[1]))
                return [(n, api_layer(la), v) for n, la, v in found]
            rows = conn.execute(_SERIES_OF_RUN, {"run_id": run_id}).all()
            newest = newest_pending(conn, [run_id])
            at = [(n, la, overlay((run_id, nid, la), s, v, newest)) for n, la, s, v, nid in rows]
            return [(n, api_layer(la), from_sql_value(v)) for n, la, (s, v) in at if s == step]

    def trailing_points(
        self, run_id: int, keys: Sequence[tuple[str, int | None, int]], limit: int
    ) -> list[list[tuple[int, float]]]:
        if not keys:
            return []
        with managed(self.engine, f"read trailing points of {len(keys)} series of run {run_id}") as conn:
            return self._trailing_points(conn, run_id, keys, limit)

    def step_maxima(self, run_id: int, keys: Sequence[tuple[str, int]], limit: int) -> list[list[tuple[int, float]]]:
        """Per name: one short trailing read of a layer whose latest step is ``top`` finds the window's first
        step (its ``limit``-th newest: every layer's points from there on hold the union's newest ``limit``
        steps), then every layer's points from it, in two statements (``matrix.columns``), reduced by step
        with numpy. A layer with fewer points than ``limit`` (a young run) bounds nothing: then each layer's
        own trailing window, as the Z-spike baseline read them before."""
        if not keys:
            return []
        with managed(self.engine, f"read the layer maxima of {len(keys)} metrics of run {run_id}") as conn:
            ids = {name: self._name_id(conn, name, create=False) for name, _top in keys}
            known = [i for i in ids.values() if i is not None]
            latest: dict[int, dict[int, int]] = {}
            if known:
                found = conn.execute(
                    select(SeriesLatestRow.name_id, SeriesLatestRow.layer, SeriesLatestRow.step).where(
                        SeriesLatestRow.run_id == run_id, SeriesLatestRow.name_id.in_(known), SeriesLatestRow.layer >= 0
                    )
                )
                newest = newest_pending(conn, [run_id], known)
                for name_id, la, st in found:
                    st = overlay((run_id, name_id, la), st, None, newest)[0]
                    latest.setdefault(int(name_id), {})[int(la)] = int(st)
            out: list[list[tuple[int, float]]] = []
            for name, top in keys:
                nid = ids[name]
                layers = {} if nid is None else latest.get(nid, {})
                ref = next((la for la, st in sorted(layers.items()) if st >= top), None)
                if ref is None:
                    out.append([])
                    continue
                window = self._trailing_points(conn, run_id, [(name, ref, top + 1)], limit)[0]
                if len(window) < limit:  # that layer is young (or sparse): every layer's own window, bounded
                    each = self._trailing_points(conn, run_id, [(name, la, top + 1) for la in sorted(layers)], limit)
                    out.append(per_step_max(each)[-limit:])
                    continue
                base = {"run_id": run_id, "name_id": nid, "start": window[0][0], "end": top}
                cols = matrix.columns(conn, base, sorted(layers))
                out.append([] if cols is None else max_by_step(cols[1], cols[2])[-limit:])
            return out

    def _trailing_points(
        self, conn: Connection, run_id: int, keys: Sequence[tuple[str, int | None, int]], limit: int
    ) -> list[list[tuple[int, float]]]:
        ids = {name: self._name_id(conn, name, create=False) for name in {k[0] for k in keys}}
        known = [i for i, k in enumerate(keys) if ids[k[0]] is not None]
        wanted = [(ids[keys[i][0]], sql_layer(keys[i][1]), keys[i][2]) for i in known]
        found = trailing_points(conn, run_id, wanted, limit)  # type: ignore[arg-type]
        out: list[list[tuple[int, float]]] = [[] for _ in keys]
        for i, window in zip(known, found):
            out[i] = [(s, from_sql_value(v)) for s, v in window]
        return out

    # -- alerts and exports ----------------------------------------------------------------------
    @retry_busy
    def add_alerts(self, run_id: int, alerts: Sequence[NewAlert]) -> list[NewAlert]:
        if not alerts:
            return []
        with managed(self.engine, f"store alerts of run {run_id}", write=True) as conn:
            return self._insert_alerts(conn, run_id, alerts)

    def _insert_alerts(self, conn: Connection, run_id: int, alerts: Sequence[NewAlert]) -> list[NewAlert]:
        """Insert ``alerts`` not stored yet (in key order: concurrent writers lock in one order); the new ones.

        One multi-row ``INSERT .. ON CONFLICT DO NOTHING RETURNING`` per ``_ALERT_ROWS`` alerts (an
        Alertmanager notification may carry thousands); an alert is new when its key came back and
        it is the first of the request with that key."""
        order = sorted(range(len(alerts)), key=lambda i: _alert_key(alerts[i]))
        created = now_utc()
        inserted: set[tuple[str, str, int, int]] = set()
        for start in range(0, len(order), _ALERT_ROWS):
            rows = [
                {
                    "run_id": run_id,
                    "rule": a.rule,
                    "severity": a.severity,
                    "name": a.name,
                    "layer": sql_layer(a.layer),
                    "step": a.step,
                    "value": to_sql_value(a.value),
                    "baseline": a.baseline,
                    "message": a.message,
                    "source": a.source,
                    "created_at": created,
                }
                for a in (alerts[i] for i in order[start : start + _ALERT_ROWS])
            ]
            t = AlertEventRow.__table__
            stmt = (
                dialect_insert(conn, t)
                .values(rows)
                .on_conflict_do_nothing(index_elements=["run_id", "rule", "name", "layer", "step"])
                .returning(t.c.rule, t.c.name, t.c.layer, t.c.step)
            )
            inserted.update((str(r), str(n), int(la), int(st)) for r, n, la, st in conn.execute(stmt))
        new: list[int] = []
        for i in order:
            key = _alert_key(alerts[i])
            if key in inserted:
                inserted.discard(key)  # a second alert of the request with the same key was not stored
                new.append(i)
        stored = [alerts[i] for i in sorted(new)]  # in the detector's order
        incidents.record(conn, run_id, stored)  # grouped in the same transaction (issue 21)
        return stored

    def list_alerts(
        self,
        run_id: int | None = None,
        project: str | None = None,
        group_id: int | None = None,
        rule: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Alert]:
        a = AlertEventRow
        q = run_scoped(a, run_id, project, group_id, rule)
        q = q.order_by(a.id.desc()).limit(limit).offset(offset)
        with managed(self.engine, "list alerts") as conn:
            return [
                Alert(
                    id=r.id,
                    run_id=r.run_id,
                    run=r.run_name,
                    project=r.project_name,
                    rule=r.rule,
                    severity=r.severity,
                    name=r.name,
                    layer=api_layer(r.layer),
                    step=r.step,
                    value=from_sql_value(r.value),
                    baseline=r.baseline,
                    message=r.message,
                    created_at=as_utc(r.created_at) or now_utc(),
                    source=r.source,
                )
                for r in conn.execute(q)
            ]

    def active_runs(self) -> list[ActiveRun]:
        q = (
            select(ProjectRow.name, RunRow.name, RunRow.id, RunRow.last_step, RunRow.last_point_at, RunRow.series_count)
            .join(ProjectRow, ProjectRow.id == RunRow.project_id)
            .where(RunRow.status == ACTIVE_STATUS, RunRow.last_step.is_not(None), RunRow.archived.is_(False))
        )
        with managed(self.engine, "read the active runs' progress") as conn:
            return [ActiveRun(p, r, rid, int(s or 0), as_utc(t), int(n)) for p, r, rid, s, t, n in conn.execute(q)]

    def latest_for_active_runs(self, names: Sequence[str] | None = None) -> list[LatestValue]:
        q = (
            select(
                ProjectRow.name,
                RunRow.name,
                RunRow.export_layers,
                MetricNameRow.name,
                SeriesLatestRow.layer,
                SeriesLatestRow.step,
                SeriesLatestRow.value,
                RunRow.last_point_at,
                RunRow.id,
                RunRow.group_id,
                SeriesLatestRow.name_id,
            )
            .select_from(SeriesLatestRow)
            .join(RunRow, RunRow.id == SeriesLatestRow.run_id)
            .join(ProjectRow, ProjectRow.id == RunRow.project_id)
            .join(MetricNameRow, MetricNameRow.id == SeriesLatestRow.name_id)
            .where(RunRow.status == ACTIVE_STATUS, RunRow.archived.is_(False))
        )
        if names is not None:  # /metrics: its gauges' names only, whatever else the runs log (issue 37)
            q = q.where(MetricNameRow.name.in_(list(names)))
        with managed(self.engine, "read latest values of active runs") as conn:
            rows = conn.execute(q).all()
            newest = newest_pending(conn, {r[8] for r in rows}, {r[10] for r in rows})
            out = []
            for p, r, e, n, la, s, v, t, rid, gid, nid in rows:
                s, v = overlay((rid, nid, la), s, v, newest)
                out.append(LatestValue(p, r, bool(e), n, api_layer(la), s, from_sql_value(v), as_utc(t), rid, gid))
            return out
