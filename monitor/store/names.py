"""Metric names interned as integer ids (``metric_names``): what a batch registers and when it is refused.

Issue 25: a refused request used to exhaust the id sequence for everyone, and each new name cost a
``count(*)`` over the table. Now:

- Only the names some point of the batch uses are registered (a columnar header may list more).
- The per-request cap (:data:`MAX_NAMES_PER_BATCH` distinct names in the batch) is checked by the
  caller before any database work (:func:`check_name_count`), so a refused batch allocates nothing.
- Known names come from a per-process cache, then one ``SELECT`` for the rest; the names still
  missing are inserted by **one** ``INSERT .. SELECT`` that skips the names already there, so on
  PostgreSQL no sequence value is drawn for an existing name (an ``INSERT .. ON CONFLICT DO
  NOTHING`` draws the default id of each row before it meets the conflict). Only two writers
  inserting the same new name at the same moment can still skip one id, and, as with any
  sequence, a transaction that rolls back after inserting a new name does not give its id back.
- ``metric_names.id`` is INTEGER (revision 0007): 2,147,483,647 names. Should a database ever use
  them all, the answer says so (:class:`NameIdsExhaustedError`, 507) instead of blaming the request.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from hyperwatch.monitor.core.errors import InvalidInputError, MonitorError

MAX_NAMES_PER_BATCH = 4096
"""Distinct metric names one batch may use (a model's hooks send a few dozen to a few hundred)."""
MAX_NAME_ID = 2**31 - 1  # metric_names.id is INTEGER on both databases

# PostgreSQL: 2200H sequence_generator_limit_exceeded, 22003 numeric_value_out_of_range
_EXHAUSTED_STATES = ("2200H", "22003")

_SELECT = {
    "postgresql": "SELECT name, id FROM metric_names WHERE name = ANY(%s::text[])",
    "sqlite": "SELECT name, id FROM metric_names WHERE name IN (SELECT value FROM json_each(?))",
}
# ORDER BY: ids in name order, whichever order a batch listed them in; the NOT EXISTS keeps a
# known name from drawing a sequence value; ON CONFLICT covers a concurrent writer's same new name
_INSERT = {
    "postgresql": (
        "INSERT INTO metric_names (name) SELECT w.name FROM unnest(%s::text[]) AS w(name) "
        "WHERE NOT EXISTS (SELECT 1 FROM metric_names AS m WHERE m.name = w.name) ORDER BY w.name "
        "ON CONFLICT (name) DO NOTHING"
    ),
    "sqlite": (
        "INSERT INTO metric_names (name) SELECT w.value FROM json_each(?) AS w "
        "WHERE NOT EXISTS (SELECT 1 FROM metric_names AS m WHERE m.name = w.value) ORDER BY w.value "
        "ON CONFLICT (name) DO NOTHING"
    ),
}


class NameIdsExhaustedError(MonitorError):
    """Every metric-name id is in use: no new name can be stored (the request itself is fine)."""

    status_code = 507  # Insufficient Storage: the server's, not the client's, and not a retry-later


def check_name_count(count: int) -> None:
    """Refuse a batch using more than :data:`MAX_NAMES_PER_BATCH` distinct names, before any work."""
    if count > MAX_NAMES_PER_BATCH:
        raise InvalidInputError(
            f"points: the batch has {count} distinct metric names; the limit is {MAX_NAMES_PER_BATCH} "
            "per batch: split it into batches with fewer names each"
        )


def _param(conn: Connection, names: Sequence[str]) -> object:
    return list(names) if conn.dialect.name == "postgresql" else json.dumps(list(names))


def name_ids(conn: Connection, names: Sequence[str], cache: dict[str, int]) -> dict[str, int]:
    """The id of each of ``names`` (distinct), registering the new ones in this transaction.

    ``cache`` (the store's, per process) gets the ids of names that existed before this
    transaction; a name inserted here is not cached, since the transaction may still roll back.
    """
    check_name_count(len(names))
    out = known_ids(conn, names, cache)
    return register(conn, [n for n in names if n not in out], out)


def known_ids(conn: Connection, names: Sequence[str], cache: dict[str, int]) -> dict[str, int]:
    """The ids of those of ``names`` registered already (cache, then one ``SELECT``); nothing inserted."""
    out = {n: cache[n] for n in names if n in cache}
    missing = [n for n in names if n not in out]
    if not missing:
        return out
    dialect = "postgresql" if conn.dialect.name == "postgresql" else "sqlite"
    found = dict(conn.exec_driver_sql(_SELECT[dialect], (_param(conn, missing),)).cursor.fetchall())
    cache.update(found)
    out.update(found)
    return out


def register(
    conn: Connection,
    new: Sequence[str],
    out: dict[str, int],
    max_names: int | None = None,
    too_many: Callable[[int, int, Sequence[str]], MonitorError] | None = None,
) -> dict[str, int]:
    """Insert ``new`` (names :func:`known_ids` did not find) and add their ids to ``out`` (returned).

    ``max_names``: refuse (raise ``too_many(max_names, ids used, new)``) when a new name would get an
    id above it: checked against the highest id before the ``INSERT`` (so a refusal draws no id), and
    against the ids drawn after it (ids increase, so no id above the limit is stored whatever writers
    race; a loser's drawn ids are lost, as with any rollback). See monitor.store.cardinality.
    """
    if not new:
        return out
    dialect = "postgresql" if conn.dialect.name == "postgresql" else "sqlite"
    refuse = too_many or _too_many
    if max_names is not None:
        # before the INSERT: on PostgreSQL a refused INSERT would still draw (and lose) an id per name
        top = conn.exec_driver_sql("SELECT coalesce(max(id), 0) FROM metric_names").scalar() or 0
        if top + len(new) > max_names:
            raise refuse(max_names, top, new)
    try:
        conn.exec_driver_sql(_INSERT[dialect], (_param(conn, new),))
    except DBAPIError as exc:
        if getattr(exc.orig, "sqlstate", None) in _EXHAUSTED_STATES:
            raise NameIdsExhaustedError(
                f"the database has used every metric-name id (metric_names.id, at most {MAX_NAME_ID:,}): "
                f"{len(new)} new name(s) of this batch cannot be stored; the request is valid and batches "
                "that use only known names are still stored. An operator must free or widen the ids "
                f"({_first_line(exc)})"
            ) from exc
        raise
    found = dict(conn.exec_driver_sql(_SELECT[dialect], (_param(conn, new),)).cursor.fetchall())
    if max_names is not None and found and max(found.values()) > max_names:  # a writer raced this one
        raise refuse(max_names, max(found.values()) - len(new), new)
    out.update(found)
    return out


def _too_many(limit: int, used: int, new: Sequence[str]) -> MonitorError:
    return InvalidInputError(
        f"points: {len(new)} new metric name(s) after {used:,} would exceed the limit of {limit:,} names"
    )


def _first_line(exc: DBAPIError) -> str:
    text = str(exc.orig).strip()
    return text.splitlines()[0] if text else type(exc).__name__
