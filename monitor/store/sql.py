"""The SQLAlchemy implementation of :class:`~monitor.store.base.Store` (SQLite and PostgreSQL)."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, insert, select, text, update
from sqlalchemy.engine import Connection, Engine, Row

from hyperwatch.monitor.core.errors import InvalidInputError, NotFoundError
from hyperwatch.monitor.store import migrate, names, removal, repair, tail
from hyperwatch.monitor.store.base import Store
from hyperwatch.monitor.store.cardinality import SeriesLimits
from hyperwatch.monitor.store.engine import BUSY_TIMEOUT_MS, make_engine, managed, retry_busy
from hyperwatch.monitor.store.entities import (
    ACTIVE_STATUS,
    RUN_STATUSES,
    SCALE_FIELDS,
    Group,
    Run,
)
from hyperwatch.monitor.store.held import HeldPoints
from hyperwatch.monitor.store.hot import HotVacuum
from hyperwatch.monitor.store.incidents import IncidentsMixin
from hyperwatch.monitor.store.ingest import LatestSteps
from hyperwatch.monitor.store.learning import LearningMixin
from hyperwatch.monitor.store.models import (
    GroupRow,
    MetricNameRow,
    ProjectRow,
    RunRow,
    RunTagRow,
)
from hyperwatch.monitor.store.outbox import Outbox
from hyperwatch.monitor.store.points import (
    as_utc,
    dialect_insert,
    now_utc,
)
from hyperwatch.monitor.store.sql_series import SeriesMixin
from hyperwatch.monitor.store.summary import SummaryMixin
from hyperwatch.monitor.store.webhooks import WebhooksMixin

log = logging.getLogger(__name__)


def _run_not_found(project: str, name: str) -> NotFoundError:
    return NotFoundError(
        f"run {name!r} not found in project {project!r}; create it first with "
        f'POST /api/v1/runs {{"name": "{name}", "project": "{project}"}}'
    )


class SqlStore(IncidentsMixin, LearningMixin, SeriesMixin, SummaryMixin, WebhooksMixin, Store):
    def __init__(self, url_or_engine: str | Engine, busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> None:
        if isinstance(url_or_engine, str):
            self.engine = make_engine(url_or_engine, busy_timeout_ms)
        else:
            self.engine = url_or_engine
        self._name_ids: dict[str, int] = {}
        self._id_names: dict[int, str] = {}
        self.hot_vacuum = HotVacuum(self.engine)
        self.latest_steps = LatestSteps()
        self.held_points = HeldPoints()  # SQLite: each run's hot rows (monitor.store.held)
        self.series_limits = SeriesLimits()  # create_app sets the service's (monitor.store.cardinality)

    # -- health ----------------------------------------------------------------------------------
    def ping(self) -> None:
        with managed(self.engine, "reach the database") as conn:
            conn.execute(text("SELECT 1"))

    def check_schema(self) -> None:
        with managed(self.engine, "read the schema revision"):
            migrate.check_schema(self.engine)

    def close(self) -> None:
        self.hot_vacuum.wait()
        self.engine.dispose()

    def webhook_outbox(self) -> Outbox:
        url = self.engine.url.render_as_string(hide_password=False)
        return Outbox(make_engine(url))  # its own pool: the deliverer never takes a request's connection

    # -- helpers ---------------------------------------------------------------------------------
    def _project_id(self, conn: Connection, project: str, create: bool) -> int | None:
        pid = conn.execute(select(ProjectRow.id).where(ProjectRow.name == project)).scalar()
        if pid is None and create:
            ins = dialect_insert(conn, ProjectRow.__table__).values(name=project, created_at=now_utc())
            conn.execute(ins.on_conflict_do_nothing(index_elements=["name"]))
            pid = conn.execute(select(ProjectRow.id).where(ProjectRow.name == project)).scalar()
        return pid

    def _name_id(self, conn: Connection, name: str, create: bool = True) -> int | None:
        if name in self._name_ids:
            return self._name_ids[name]
        if create:
            return names.name_ids(conn, [name], self._name_ids)[name]
        nid = conn.execute(select(MetricNameRow.id).where(MetricNameRow.name == name)).scalar()
        if nid is not None:
            self._name_ids[name] = int(nid)  # it existed before this transaction: safe to remember
        return nid

    def _names_by_id(self) -> dict[int, str]:
        """The names cached so far by id (the cache only grows: rebuilt when it has grown)."""
        if len(self._id_names) != len(self._name_ids):
            known = dict(self._name_ids)  # one C-level copy: other threads may add names meanwhile
            self._id_names = {i: n for n, i in known.items()}
        return self._id_names

    def _run_query(self) -> Any:
        return (
            select(RunRow.__table__, ProjectRow.name.label("project"), GroupRow.name.label("group_name"))
            .join(ProjectRow, ProjectRow.id == RunRow.project_id)
            .outerjoin(GroupRow, GroupRow.id == RunRow.group_id)
        )

    def _to_runs(self, conn: Connection, rows: Sequence[Row[Any]]) -> list[Run]:
        ids = [r.id for r in rows]
        tags: dict[int, list[str]] = {i: [] for i in ids}
        if ids:
            for run_id, tag in conn.execute(
                select(RunTagRow.run_id, RunTagRow.tag).where(RunTagRow.run_id.in_(ids)).order_by(RunTagRow.tag)
            ):
                tags[run_id].append(tag)
        out = []
        for row in rows:
            try:
                out.append(self._to_run(row, tags[row.id]))
            except (TypeError, ValueError, KeyError, AttributeError) as exc:
                # One unreadable row must not fail a list for everyone: skip it, say which.
                log.warning(
                    "run id %s cannot be read (%s: %s); left out of the answer", row.id, type(exc).__name__, exc
                )
        return out

    @staticmethod
    def _to_run(row: Row[Any], tags: list[str]) -> Run:
        """One run row as the API can send it (a bad stored value is repaired and logged, see repair)."""
        what = f"run id {row.id}"
        scale = {f: getattr(row, f) for f in SCALE_FIELDS}
        for f in repair.POSITIVE_SCALE_FIELDS:
            scale[f] = repair.positive_scale(scale[f], f"{what} {f}")
        for f in ("optimizer", "parameterization"):
            scale[f] = repair.text(scale[f], f"{what} {f}")
        return Run(
            id=row.id,
            project=row.project,
            name=row.name,
            status=row.status or ACTIVE_STATUS,
            group=row.group_name,
            group_id=row.group_id,
            config=repair.json_object(row.config, f"{what} config"),
            summary=repair.summary(_decode_json_floats(row.summary), f"{what} summary"),
            tags=tags,
            export_layers=bool(row.export_layers),
            unavailable=row.unavailable if isinstance(row.unavailable, dict) else {},
            last_step=row.last_step,
            last_point_at=as_utc(row.last_point_at),
            created_at=as_utc(row.created_at) or now_utc(),
            updated_at=as_utc(row.updated_at) or now_utc(),
            archived=bool(row.archived),
            **scale,
        )

    def _one(self, conn: Connection, rows: Sequence[Row[Any]]) -> Run:
        runs = self._to_runs(conn, rows)
        if not runs:
            raise InvalidInputError(f"run id {rows[0].id} is stored in a form that cannot be read; see the service log")
        return runs[0]

    def _get_run(self, conn: Connection, run_id: int) -> Run:
        rows = conn.execute(self._run_query().where(RunRow.id == run_id)).all()
        if not rows:
            raise NotFoundError(f"run id {run_id} not found; list runs with GET /api/v1/runs")
        return self._one(conn, rows)

    def _apply_run_fields(self, conn: Connection, run_id: int, project_id: int, fields: dict[str, Any]) -> None:
        values: dict[str, Any] = {
            k: fields[k] for k in (*SCALE_FIELDS, "config", "export_layers", "archived") if k in fields
        }
        if "status" in fields:
            if fields["status"] not in RUN_STATUSES:
                raise InvalidInputError(f"status: {fields['status']!r} is not one of {list(RUN_STATUSES)}")
            values["status"] = fields["status"]
        if "summary" in fields:
            old = conn.execute(select(RunRow.summary).where(RunRow.id == run_id)).scalar()
            old = old if isinstance(old, dict) else {}  # a bad stored summary is replaced, not merged
            values["summary"] = {**old, **_encode_json_floats(fields["summary"])}
        if fields.get("unavailable") is not None:  # merged: the hooks report what they learn as they go
            old = conn.execute(select(RunRow.unavailable).where(RunRow.id == run_id)).scalar() or {}
            values["unavailable"] = {**old, **fields["unavailable"]}
        if "group" in fields:
            values["group_id"] = None
            if fields["group"] is not None:
                group, _ = self._upsert_group(conn, project_id, fields["group"], {})
                values["group_id"] = group
        values["updated_at"] = now_utc()
        was = conn.execute(select(RunRow.status).where(RunRow.id == run_id)).scalar() if "status" in values else None
        conn.execute(update(RunRow).where(RunRow.id == run_id).values(**values))
        if values.get("status", ACTIVE_STATUS) != ACTIVE_STATUS:  # stopped: its open ranges and hot points packed
            tail.seal_stopped(conn, run_id)
        elif "status" in values and was not in (None, ACTIVE_STATUS):  # running again: its last steps hot rows,
            tail.unfold(conn, run_id)  # as the writers expect them (store.tail)
        if "tags" in fields:
            conn.execute(delete(RunTagRow).where(RunTagRow.run_id == run_id))
            if fields["tags"]:
                conn.execute(insert(RunTagRow), [{"run_id": run_id, "tag": t} for t in sorted(set(fields["tags"]))])

    # -- runs ------------------------------------------------------------------------------------
    @retry_busy
    def upsert_run(self, project: str, name: str, fields: dict[str, Any]) -> tuple[Run, bool]:
        with managed(self.engine, f"create or update run {project}/{name}", write=True) as conn:
            pid = self._project_id(conn, project, create=True)
            assert pid is not None
            run_id = conn.execute(select(RunRow.id).where(RunRow.project_id == pid, RunRow.name == name)).scalar()
            created = run_id is None
            if created:
                now = now_utc()
                ins = dialect_insert(conn, RunRow.__table__).values(
                    project_id=pid,
                    name=name,
                    status=ACTIVE_STATUS,
                    config={},
                    summary={},
                    export_layers=False,
                    created_at=now,
                    updated_at=now,
                )
                conn.execute(ins.on_conflict_do_nothing(index_elements=["project_id", "name"]))
                run_id = conn.execute(
                    select(RunRow.id).where(RunRow.project_id == pid, RunRow.name == name)
                ).scalar_one()
            assert run_id is not None
            self._apply_run_fields(conn, run_id, pid, fields)
            run = self._get_run(conn, run_id)
        self._after_status(fields)
        return run, created

    @retry_busy
    def update_run(self, run_id: int, fields: dict[str, Any]) -> Run:
        with managed(self.engine, f"update run {run_id}", write=True) as conn:
            pid = conn.execute(select(RunRow.project_id).where(RunRow.id == run_id)).scalar()
            if pid is None:
                raise NotFoundError(f"run id {run_id} not found; list runs with GET /api/v1/runs")
            self._apply_run_fields(conn, run_id, pid, fields)
            run = self._get_run(conn, run_id)
        self._after_status(fields)
        return run

    def _after_status(self, fields: dict[str, Any]) -> None:
        """Committed: a run that stopped left ``open_chunks``, whose indexes are rebuilt (store.hot)."""
        if fields.get("status", ACTIVE_STATUS) != ACTIVE_STATUS:
            self.hot_vacuum.stopped()

    @retry_busy
    def delete_run(self, run_id: int) -> tuple[str, str, int]:
        with managed(self.engine, f"delete run {run_id}", write=True) as conn:
            deleted = removal.delete_run(conn, run_id)
        self.latest_steps.forget(run_id)
        self.held_points.forget(run_id)
        return deleted

    def get_run(self, run_id: int) -> Run:
        with managed(self.engine, f"read run {run_id}") as conn:
            return self._get_run(conn, run_id)

    def find_run(self, project: str, name: str) -> Run:
        with managed(self.engine, f"find run {project}/{name}") as conn:
            rows = conn.execute(self._run_query().where(ProjectRow.name == project, RunRow.name == name)).all()
            if not rows:
                raise _run_not_found(project, name)
            return self._one(conn, rows)

    def list_runs(
        self,
        project: str | None = None,
        group: str | None = None,
        tags: Sequence[str] = (),
        status: str | None = None,
        limit: int = 100,
        offset: int = 0,
        archived: bool | None = False,
    ) -> list[Run]:
        q = self._run_query()
        if archived is not None:
            q = q.where(RunRow.archived.is_(archived))
        if project is not None:
            q = q.where(ProjectRow.name == project)
        if group is not None:
            q = q.where(GroupRow.name == group)
        if status is not None:
            q = q.where(RunRow.status == status)
        for tag in tags:
            q = q.where(RunRow.id.in_(select(RunTagRow.run_id).where(RunTagRow.tag == tag)))
        q = q.order_by(RunRow.id).limit(limit).offset(offset)
        with managed(self.engine, "list runs") as conn:
            return self._to_runs(conn, conn.execute(q).all())

    # -- groups ----------------------------------------------------------------------------------
    def _upsert_group(self, conn: Connection, pid: int, name: str, fields: dict[str, Any]) -> tuple[int, bool]:
        gid = conn.execute(select(GroupRow.id).where(GroupRow.project_id == pid, GroupRow.name == name)).scalar()
        created = gid is None
        if created:
            now = now_utc()
            ins = dialect_insert(conn, GroupRow.__table__).values(
                project_id=pid, name=name, description="", config={}, thresholds={}, created_at=now, updated_at=now
            )
            conn.execute(ins.on_conflict_do_nothing(index_elements=["project_id", "name"]))
            gid = conn.execute(
                select(GroupRow.id).where(GroupRow.project_id == pid, GroupRow.name == name)
            ).scalar_one()
        values = {k: fields[k] for k in ("description", "config", "thresholds", "learn_thresholds") if k in fields}
        if values:
            conn.execute(update(GroupRow).where(GroupRow.id == gid).values(updated_at=now_utc(), **values))
        assert gid is not None
        return int(gid), created

    def _get_group(self, conn: Connection, group_id: int) -> Group:
        row = conn.execute(
            select(GroupRow.__table__, ProjectRow.name.label("project"))
            .join(ProjectRow, ProjectRow.id == GroupRow.project_id)
            .where(GroupRow.id == group_id)
        ).first()
        if row is None:
            raise NotFoundError(f"group id {group_id} not found; list groups with GET /api/v1/groups")
        what = f"group id {row.id}"
        return Group(
            id=row.id,
            project=row.project,
            name=row.name,
            description=repair.text(row.description, f"{what} description", default="") or "",
            config=repair.json_object(row.config, f"{what} config"),
            thresholds=repair.thresholds(row.thresholds, f"{what} thresholds"),
            created_at=as_utc(row.created_at) or now_utc(),
            updated_at=as_utc(row.updated_at) or now_utc(),
            learn_thresholds=repair.learn_setting(row.learn_thresholds, f"{what} learn_thresholds"),
            learned=repair.learned(row.learned, f"{what} learned"),
        )

    @retry_busy
    def upsert_group(self, project: str, name: str, fields: dict[str, Any]) -> tuple[Group, bool]:
        with managed(self.engine, f"create or update group {project}/{name}", write=True) as conn:
            pid = self._project_id(conn, project, create=True)
            assert pid is not None
            gid, created = self._upsert_group(conn, pid, name, fields)
            return self._get_group(conn, gid), created

    @retry_busy
    def update_group(self, group_id: int, fields: dict[str, Any]) -> Group:
        with managed(self.engine, f"update group {group_id}", write=True) as conn:
            g = self._get_group(conn, group_id)
            pid = self._project_id(conn, g.project, create=False)
            assert pid is not None
            self._upsert_group(conn, pid, g.name, fields)
            return self._get_group(conn, group_id)

    def get_group(self, group_id: int) -> Group:
        with managed(self.engine, f"read group {group_id}") as conn:
            return self._get_group(conn, group_id)

    def list_groups(self, project: str | None = None) -> list[Group]:
        q = select(GroupRow.id).join(ProjectRow, ProjectRow.id == GroupRow.project_id)
        if project is not None:
            q = q.where(ProjectRow.name == project)
        out = []
        with managed(self.engine, "list groups") as conn:
            for gid in conn.execute(q.order_by(GroupRow.id)).scalars().all():
                try:
                    out.append(self._get_group(conn, gid))
                except (TypeError, ValueError, KeyError, AttributeError) as exc:
                    log.warning(
                        "group id %s cannot be read (%s: %s); left out of the answer", gid, type(exc).__name__, exc
                    )
        return out


def _encode_json_floats(obj: Any) -> Any:
    """JSON columns cannot hold NaN/Inf: store them as the wire strings (decoded on the way out)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "NaN" if math.isnan(obj) else ("Infinity" if obj > 0 else "-Infinity")
    if isinstance(obj, dict):
        return {k: _encode_json_floats(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_encode_json_floats(v) for v in obj]
    return obj


def _decode_json_floats(obj: Any) -> Any:
    if isinstance(obj, str) and obj in ("NaN", "Infinity", "-Infinity"):
        return float(obj.replace("Infinity", "inf"))
    if isinstance(obj, dict):
        return {k: _decode_json_floats(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode_json_floats(v) for v in obj]
    return obj
