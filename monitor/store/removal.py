"""Deleting a run and everything it owns, in one transaction (issue 35; archiving is ``runs.archived``).

The run's row is locked first, as every writer of the run locks it (:func:`monitor.store.ingest.lock_run`):
an ``UPDATE runs .. RETURNING`` that waits for a batch of the run being stored to commit, and makes a
batch that comes later wait for the delete and then find no run (404, nothing acknowledged is lost).
SQLite: ``BEGIN IMMEDIATE`` (``managed(write=True)``) already keeps every other writer out.

Then the project's ``series_count`` (migration 0011) loses the run's ``series_count``, in the order
every writer takes the two rows (its run's, then its project's: ``monitor.store.cardinality``), and the
rows that reference the run go, children before the run (:data:`OWNED`: every table with a foreign
key to ``runs.id``; the ``ON DELETE CASCADE`` of those keys is not relied on, SQLite enforces it only
with ``PRAGMA foreign_keys``). On PostgreSQL ``hot_points`` is a view over two of them.
"""

from __future__ import annotations

from sqlalchemy import delete, update
from sqlalchemy.engine import Connection

from hyperwatch.monitor.core.errors import NotFoundError
from hyperwatch.monitor.store.alert_models import AlertEventRow, IncidentRow
from hyperwatch.monitor.store.models import (
    Base,
    BatchRangeRow,
    IngestedBatchRow,
    MetricChunkRow,
    MetricPointRow,
    MetricRollupRow,
    OpenChunkRow,
    PointBatchRow,
    ProjectRow,
    RunRow,
    RunTagRow,
    SeriesLatestRow,
)

OWNED = (
    PointBatchRow,
    MetricPointRow,
    OpenChunkRow,
    MetricChunkRow,
    OpenChunkRow,
    MetricRollupRow,
    SeriesLatestRow,
    IngestedBatchRow,
    BatchRangeRow,
    AlertEventRow,
    IncidentRow,
    RunTagRow,
)
"""The tables whose rows belong to one run (``run_id``), deleted in this order before the run's row."""


def referencing_tables() -> set[str]:
    """Every table with a foreign key to ``runs`` (a test checks :data:`OWNED` covers them)."""
    return {
        table.name
        for table in Base.metadata.tables.values()
        if any(fk.column.table.name == "runs" for fk in table.foreign_keys)
    }


def delete_run(conn: Connection, run_id: int) -> tuple[str, str, int]:
    """Delete run ``run_id`` and its rows inside ``conn``'s write transaction; its (project, name, series)."""
    locked = conn.execute(
        update(RunRow)
        .where(RunRow.id == run_id)
        .values(prior_token=RunRow.ingest_token)  # a no-op write: the row lock
        .returning(RunRow.project_id, RunRow.name, RunRow.series_count)
    ).first()
    if locked is None:
        raise NotFoundError(f"run id {run_id} not found; list runs with GET /api/v1/runs")
    project_id, name, series = int(locked.project_id), str(locked.name), int(locked.series_count or 0)
    project = conn.execute(
        update(ProjectRow)
        .where(ProjectRow.id == project_id)
        .values(series_count=ProjectRow.series_count - series)
        .returning(ProjectRow.name)
    ).scalar_one()
    for row in OWNED:
        conn.execute(delete(row).where(row.run_id == run_id))
    conn.execute(delete(RunRow).where(RunRow.id == run_id))
    return str(project), name, series
