"""Bounded cardinality (issue 37): how many series a run and a project may hold, and names the database.

A buggy script that logs a new metric name every step (``user.loss_step_123``) once stored a million
series in 20 s, and every read of "all of a run" then cost seconds and gigabytes. Three limits,
each a setting (``monitor.core.config``), refuse such a batch **whole** with a 409 that names the
limit, the count and the setting to raise (:class:`SeriesLimitError`):

- ``HYPERWATCH_MAX_SERIES_PER_RUN``: distinct (name, layer) series of one run. Exact under
  concurrent writers on both databases: every writer of a run holds the run's row lock
  (:func:`monitor.store.ingest.lock_run`) and knows the run's series as of that lock (the process
  cache or ``series_latest``, read there anyway), so the new series of a batch cost one dict look-up
  each and no ``count(*)``. ``runs.series_count`` (migration 0011) records the count for the reads.
- ``HYPERWATCH_MAX_SERIES_PER_PROJECT``: the series of all the project's runs, kept in
  ``projects.series_count``: one ``UPDATE .. RETURNING`` by a batch that brings new series (a run's
  first batches; later ones skip it). On PostgreSQL it locks the project's row until the commit, so
  two writers of the project count one after the other; every writer locks its run's row first and
  the project's second, so they never wait on each other in a circle. SQLite has one writer.
- ``HYPERWATCH_MAX_METRIC_NAMES``: names in ``metric_names`` (shared by all projects), counted by
  their ids, which are drawn in increasing order (a sequence; SQLite's ``max(rowid) + 1``): a batch
  whose new names would take the highest id past the limit is refused before its ``INSERT`` (one
  primary-key look-up, only for batches with new names), and one whose drawn ids passed it (a racing
  writer) after it (:func:`monitor.store.names.register`): no id above the limit is ever stored. An
  id lost to a rolled-back transaction counts as used.

The checks run before any name is registered (a refused batch draws no name id) and the
transaction rolls back on refusal, so nothing of the batch is stored, the counts included.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from sqlalchemy.engine import Connection

from hyperwatch.hooks.columns import NULL_INT, PointColumns
from hyperwatch.monitor.core.errors import ConflictError
from hyperwatch.monitor.store import names
from hyperwatch.monitor.store.models import RUN_LEVEL_LAYER
from hyperwatch.monitor.store.points import CODE_LAYER_BITS, series_code


@dataclass(frozen=True)
class SeriesLimits:
    """The three limits (defaults as the settings'); ``Store.series_limits``, set by ``create_app``."""

    per_run: int = 20_000
    per_project: int = 5_000_000
    names: int = 100_000


class SeriesLimitError(ConflictError):
    """A batch would take its run, its project or the database past a cardinality limit: refused whole.

    409, not 422: the batch itself is valid (into an empty run it would be stored); the run's state
    conflicts with it. Not 429 or 503 either: sending it again cannot succeed until someone raises
    the limit, and the hooks' HTTP sink retries those forever; a 409 it sets aside in ``rejected/``.
    """


_BUMP_PROJECT = {
    dialect: (
        f"UPDATE projects SET series_count = series_count + {m} "
        f"WHERE id = (SELECT project_id FROM runs WHERE id = {m}) RETURNING series_count, name"
    )
    for dialect, m in (("postgresql", "%s"), ("sqlite", "?"))
}
_SET_RUN = {
    dialect: f"UPDATE runs SET series_count = {m} WHERE id = {m}"
    for dialect, m in (("postgresql", "%s"), ("sqlite", "?"))
}
_HINT = "log fewer distinct (name, layer) pairs (a name that changes with the step is the usual cause)"


def used_names(columns: PointColumns) -> list[str]:
    """The names some point of the batch uses (a columnar header may list more)."""
    return [columns.names[i] for i in np.unique(columns.name_index).tolist()]


def new_series(columns: PointColumns, ids: dict[str, int], known: dict[int, int]) -> int:
    """How many distinct (name, layer) series of the batch's points the run holds no point of.

    ``ids``: the names registered so far (a name missing is new, and so is each of its series);
    ``known``: the run's series by :func:`points.series_code` (its latest steps)."""
    if not len(columns):
        return 0
    name_id = np.array([ids.get(n, -1) for n in columns.names], dtype=np.int64)[columns.name_index]
    layer = np.where(columns.layer == NULL_INT, RUN_LEVEL_LAYER, columns.layer).astype(np.int64)
    unknown = name_id < 0
    count = 0
    if unknown.any():  # keyed by the name's place in the batch: it has no id yet
        index = columns.name_index[unknown].astype(np.int64)
        count += len(np.unique((index << CODE_LAYER_BITS) | (layer[unknown] + 1)))
    codes = np.unique(series_code(name_id[~unknown], layer[~unknown])).tolist()
    return count + sum(1 for code in codes if code not in known)


def admit(
    conn: Connection,
    run_id: int,
    what: str,
    columns: PointColumns,
    known: dict[int, int],
    cache: dict[str, int],
    limits: SeriesLimits,
) -> dict[str, int]:
    """Check the batch against the limits and register its new names; the id of each name (-1: unused).

    Call under the run's row lock, with ``known`` the run's series as of that lock. Raises
    :class:`SeriesLimitError` (the caller's transaction then rolls back: nothing is stored)."""
    used = used_names(columns)
    names.check_name_count(len(used))
    ids = names.known_ids(conn, used, cache)
    added = new_series(columns, ids, known)
    if added:
        held = len(known)
        if held + added > limits.per_run:
            raise SeriesLimitError(
                f"points: {what} holds {held:,} series and this batch adds {added:,} new ones, over the limit "
                f"of {limits.per_run:,} series per run (HYPERWATCH_MAX_SERIES_PER_RUN); nothing of the batch "
                f"was stored: {_HINT}, or raise the setting"
            )
        dialect = "postgresql" if conn.dialect.name == "postgresql" else "sqlite"
        total, project = conn.exec_driver_sql(_BUMP_PROJECT[dialect], (added, run_id)).one()
        if total > limits.per_project:
            raise SeriesLimitError(
                f"points: project {project!r} holds {total - added:,} series in all its runs and this batch of "
                f"{what} adds {added:,} new ones, over the limit of {limits.per_project:,} series per project "
                f"(HYPERWATCH_MAX_SERIES_PER_PROJECT); nothing of the batch was stored: {_HINT}, or raise "
                "the setting"
            )
        conn.exec_driver_sql(_SET_RUN[dialect], (held + added, run_id))
    ids = names.register(conn, [n for n in used if n not in ids], ids, limits.names, _name_limit)
    return {n: ids.get(n, -1) for n in columns.names}


def _name_limit(limit: int, used: int, new: Sequence[str]) -> SeriesLimitError:
    return SeriesLimitError(
        f"points: the database holds {used:,} metric names (ids in use) and this batch adds {len(new):,} new "
        f"one(s) (e.g. {new[0]!r}), over the limit of {limit:,} names (HYPERWATCH_MAX_METRIC_NAMES), all projects "
        "together; nothing of the batch was stored: batches that use only known names are still stored. Log "
        "fewer distinct names (a name that changes with the step is the usual cause), or raise the setting"
    )
