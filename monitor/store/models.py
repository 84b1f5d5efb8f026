"""SQLAlchemy tables. Alembic (``migrations/``) owns the schema; these mirror it for queries.

Sizing for 10^9 metric points (the tables that matter)
------------------------------------------------------
Keys are compact integers everywhere: metric names are interned in ``metric_names`` (INTEGER
id since revision 0007, :mod:`monitor.store.names`), run-level points use ``layer = -1`` instead of
NULL so keys stay NOT NULL, steps are BIGINT.

On PostgreSQL a point lives in one of three places (:mod:`monitor.store.compact` and
:mod:`monitor.store.pending` keep the split exact; SQLite in the last two, since revision 0006):

- ``point_batches``, one row per batch and metric name, its layers, steps, tokens and values as
  arrays: the *pending* points, new steps of a batch that seals no chunk (steady training: 15
  batches of every 16). One row of arrays costs the database ~0.3 ms where 512 point rows cost
  ~2.7 ms (half of it their foreign-key checks), and they leave it again as one ``DELETE``.
- ``metric_points``, one row per point, primary key ``(run_id, name_id, layer, step)`` and no
  surrogate id: the other *hot* points (a pending batch taken back by an overwrite, a late step or
  a series logged at another rhythm), by binary COPY or upsert. Pending points and these rows are
  the steps of each series at or past its sealed boundary ``(latest + 1) // CHUNK_STEPS *
  CHUNK_STEPS`` (less than 16 steps per series); the view ``hot_points`` is their union, and every
  read of hot points reads it (:func:`hot_relation`).
- ``metric_chunks`` since revision 0014 (issue 36): one *segment* row per series and aligned range of
  ``SEGMENT_STEPS`` (1,024) sealed steps, values and steps compressed by pcodec
  (:mod:`monitor.store.segcodec`, ~4.4 B/point on issue 36's workload), the open range's sealed part
  as a partial segment (packed every ``PACK_STEPS``), then at most 15 rows of 16 steps as below;
  each row keeps its min and max with their steps; ``data`` is ``STORAGE EXTERNAL`` on PostgreSQL
  (a segment is TOASTed out of line, not compressed again). Since 0015 a running run's partial segments
  and 16-step chunks (what packs rewrite) are in ``open_chunks``; reads select ``chunk_rows``, both. Before 0014:
- ``metric_chunks``, one row per series and 16 steps: the sealed points packed (steps as one
  offset when consecutive, tokens as ``t0 + dt * step`` when linear, the values as raw doubles:
  ~150 B for 16 points; see :mod:`monitor.store.chunks`). A chunk is written once, when the
  series reaches its last step, by the batch that does so (the hot points are deleted in the same
  transaction, the batch's own points of it never go through them); a late write into it
  rewrites that one row.

Why: on PostgreSQL a row costs ~94 B whatever it holds (measured with COPY: 24 B tuple header,
4 B line pointer, 8-byte alignment of 56 B of data, a 28 B index entry, page fill), so one row per
point could never come near 40 B/point; a chunk row spreads that over 16 points.

Measured (2026-11-24, PostgreSQL 15, ``bench/ingest.py``: the sum of ``pg_total_relation_size``
over every table, i.e. heap + indexes + TOAST, after ``VACUUM (ANALYZE)``; 64 layers x 8
indicators, 1,024,000 points through HTTP): **27.6 B/point** at one step (512 points) per batch,
27.3 at 4,096-point batches (29.0 and 28.5 with hot rows instead of pending batches, 114.6 and
105.1 before chunks; 10^9 points ~ 28 GB instead of ~110 GB). Per table (the same workload through
the store, before pending batches): chunks 15.4 B/point (heap 12.8 at ~205 B a row, index 2.6),
rollups 11.2, ``series_latest`` 0.14 (its rows rewritten by every batch before 0020; fillfactor 50 since 0018), batch
ids 0.4, the rest 0.5. The hot tables cost a fixed amount per series (less than one chunk's worth
of points plus what was deleted since the last vacuum: :mod:`monitor.store.hot`), so a short run
pays more per point: 102,400 points measure 34 B/point (3.4 of them the empty schema).
SQLite packs sealed points into chunks too (``WITHOUT ROWID`` tables, clustered on the primary key:
a row *is* its index entry, varint-packed): ~17 B/point on the same workload, against 31.5-31.9
with one row per point before revision 0006; why it packs is in :mod:`monitor.store.compact`.

Non-finite values: ``value`` is an IEEE double; +Inf and -Inf are stored as themselves on both
databases. NaN is stored as SQL NULL (``value`` is otherwise never NULL). Why not a NaN double on
PostgreSQL: SQLite cannot store NaN (it silently turns it into NULL), so one representation on both
databases keeps queries identical, and SQL ``min``/``max`` then skip NaN instead of PostgreSQL
sorting NaN above +Inf and hiding every real maximum. The store maps NULL <-> NaN at its boundary;
a partial index over non-finite points lets reads return every NaN/Inf event without a scan.
Inside a chunk's blob the doubles are raw IEEE values (NaN as NaN); decoding maps NaN to the same
NULL, so a chunked point reads exactly like a row.

``metric_rollups`` keeps min and max (with their steps) per block of 1,024 and 4,096 steps since
revision 0014 (16 and 256 before it: those rows cost as much as the data on PostgreSQL) so a
2,000-bucket read of a 10^7-point series touches a few thousand rollup rows instead of 10^7 points
(bench/ingest.py: ~30 ms on PostgreSQL and ~15-27 ms on SQLite). Chunks
carry a count of their NaN/Inf points and a partial index over the ones that have any, as
``metric_points`` has for its rows.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    DDL,
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    event,
    false,
    text,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NONFINITE_PREDICATE = "value IS NULL OR value > 1.7976931348623157e308 OR value < -1.7976931348623157e308"
"""SQL true for NaN (stored as NULL), +Inf and -Inf; the same text as the partial index's WHERE."""

RUN_LEVEL_LAYER = -1
"""``layer`` of a run-level point (the wire's ``null``)."""

SEGMENT_STEPS = 1024
"""Steps of a segment (:mod:`monitor.store.segcodec`): an aligned range packed into one compressed row
once sealed (1,024 rather than 2,048: the workload's 2,000-step series seal a whole one; 4.47 against
4.40 B/pt in bench/README_storage.md)."""

ROLLUP_LEVELS: dict[int, int] = {2: SEGMENT_STEPS, 3: 4096}
"""rollup level -> block width in steps; the finest is computed from a segment's points when it
seals, each coarser one from the level below it. Level 1 (16 steps) and the old level 2 (256) were
dropped by revision 0014: inside a segment a rollup row per 16 steps cost as much as the data."""

CHUNK_STEPS = 16
"""Steps per version-1 ``metric_chunks`` row (the open tail; a segment holds ``SEGMENT_CHUNKS`` of them)."""

SEGMENT_CHUNKS = SEGMENT_STEPS // CHUNK_STEPS

PACK_STEPS = 256
"""A series' open segment range is packed into its (partial) segment row whenever its sealed boundary
passes a multiple of this (:mod:`monitor.store.segments`): at most 15 raw chunks per series remain."""

COMPACTING_DIALECTS = frozenset({"postgresql", "sqlite"})
"""Where sealed points move into chunks (both, since revision 0006: see :mod:`monitor.store.compact`)."""

PENDING_DIALECTS = frozenset({"postgresql"})
"""Where a batch of new steps waits as one row of arrays per name (:mod:`monitor.store.pending`): the
reads unnest them in SQL, which SQLite cannot; its in-process inserts of rows into a small hot table
cost it little (measured: see compact.py)."""

HOT_POINTS = "hot_points"
"""PostgreSQL's view of every hot point: ``metric_points`` rows and pending batches' elements (0006)."""


OPEN_CHUNKS = "open_chunks"
"""The open ranges' rows (revision 0015): churned by every pack, emptied when a run stops."""

CHUNK_TABLES = ("metric_chunks", OPEN_CHUNKS)
CHUNK_ROWS = "chunk_rows"
"""The view every read of chunk rows selects from: ``metric_chunks`` UNION ALL ``open_chunks`` (0015)."""


def hot_relation(dialect: str) -> str:
    """What a read of hot points selects from (see :mod:`monitor.store.pending`)."""
    return HOT_POINTS if dialect in PENDING_DIALECTS else "metric_points"


Double = Float(precision=53).with_variant(Float(), "sqlite")
Int2Array = LargeBinary().with_variant(postgresql.ARRAY(SmallInteger()), "postgresql")
Int8Array = LargeBinary().with_variant(postgresql.ARRAY(BigInteger()), "postgresql")
Float8Array = LargeBinary().with_variant(postgresql.ARRAY(Float(precision=53)), "postgresql")


class Base(DeclarativeBase):
    metadata = MetaData(
        naming_convention={
            "ix": "ix_%(table_name)s_%(column_0_N_name)s",
            "uq": "uq_%(table_name)s_%(column_0_N_name)s",
            "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
            "pk": "pk_%(table_name)s",
        }
    )


class ProjectRow(Base):
    __tablename__ = "projects"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # the series of all its runs (migration 0011, monitor.store.cardinality)
    series_count: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))


class GroupRow(Base):
    __tablename__ = "groups"
    __table_args__ = (UniqueConstraint("project_id", "name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(200))
    description: Mapped[str] = mapped_column(Text, default="")
    config: Mapped[dict] = mapped_column(JSON)
    thresholds: Mapped[dict] = mapped_column(JSON)
    # migration 0010 (monitor.thresholds.learned): learn thresholds from the group's finished healthy runs
    # (None: the service's default), and what was read from those runs (None: not read yet)
    learn_thresholds: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    learned: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class RunRow(Base):
    __tablename__ = "runs"
    __table_args__ = (
        UniqueConstraint("project_id", "name"),
        Index("ix_runs_group_id", "group_id"),
        Index("ix_runs_status", "status"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    group_id: Mapped[int | None] = mapped_column(ForeignKey("groups.id", ondelete="SET NULL"), nullable=True)
    name: Mapped[str] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16))
    config: Mapped[dict] = mapped_column(JSON)
    summary: Mapped[dict] = mapped_column(JSON)
    depth: Mapped[int | None] = mapped_column(Integer, nullable=True)
    width: Mapped[int | None] = mapped_column(Integer, nullable=True)
    total_params: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    active_params: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    tokens: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    total_steps: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    flops: Mapped[float | None] = mapped_column(Double, nullable=True)
    lr: Mapped[float | None] = mapped_column(Double, nullable=True)
    optimizer: Mapped[str | None] = mapped_column(String(64), nullable=True)
    parameterization: Mapped[str | None] = mapped_column(String(64), nullable=True)
    export_layers: Mapped[bool] = mapped_column(Boolean, default=False)
    unavailable: Mapped[dict | None] = mapped_column(JSON, nullable=True)  # migration 0002; None = {}
    last_step: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    last_point_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    # a new random value with every stored batch (migration 0006): a service's cached series steps
    # are current while the row holds the token it committed (monitor.store.ingest)
    ingest_token: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    prior_token: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))  # before the last batch
    # the hooks process that writes the run (migration 0009, monitor.store.identity); None = any client
    attach_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # distinct (name, layer) series, = its series_latest rows (migration 0011, monitor.store.cardinality)
    series_count: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    # left out of lists, scale comparisons and alert lists unless asked for (migration 0012, store.removal)
    archived: Mapped[bool] = mapped_column(Boolean, server_default=false())
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class RunTagRow(Base):
    __tablename__ = "run_tags"
    __table_args__ = (Index("ix_run_tags_tag", "tag"),)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    tag: Mapped[str] = mapped_column(String(100), primary_key=True)


class MetricNameRow(Base):
    __tablename__ = "metric_names"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)


class MetricPointRow(Base):
    __tablename__ = "metric_points"
    __table_args__ = (
        Index(
            "ix_metric_points_nonfinite",
            "run_id",
            "name_id",
            "layer",
            "step",
            sqlite_where=text(NONFINITE_PREDICATE),
            postgresql_where=text(NONFINITE_PREDICATE),
        ),
        {"sqlite_with_rowid": False},
    )
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    name_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    layer: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    step: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    tokens: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    value: Mapped[float | None] = mapped_column(Double, nullable=True)


class _ChunkColumns:
    """The columns of a chunk or segment row (see store.chunks), in both chunk tables."""

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    name_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    layer: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    chunk: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    nonfinite: Mapped[int] = mapped_column(SmallInteger)  # NaN/+-Inf points inside: > 0 is in the partial index
    data: Mapped[bytes] = mapped_column(LargeBinary)  # PostgreSQL: STORAGE EXTERNAL (0014, below)
    # the row's smallest and largest value with their steps (0014; NULL: NaN alone, or a row from
    # before 0014), what the runs table's extremes and learned peaks read for the open segment range
    min_step: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    min_value: Mapped[float | None] = mapped_column(Double, nullable=True)
    max_step: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    max_value: Mapped[float | None] = mapped_column(Double, nullable=True)
    # PostgreSQL (0016): the blob's longest prefix of whole TOAST chunks, ``data`` the rest; NULL when
    # shorter than one TOAST chunk, and always on SQLite (store.toast); reads select chunk_rows, both joined
    data_ext: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)


def _chunk_table_args(name: str, rowid: bool) -> tuple[Any, ...]:
    nonfinite = Index(
        f"ix_{name}_nonfinite",
        "run_id",
        "name_id",
        "layer",
        "chunk",
        sqlite_where=text("nonfinite > 0"),
        postgresql_where=text("nonfinite > 0"),
    )
    return (nonfinite, {"sqlite_with_rowid": rowid})


class MetricChunkRow(_ChunkColumns, Base):
    """Whole segments, and stopped runs' partial ones (0015). A rowid table on SQLite since 0015: a row
    of up to ~990 bytes stays in its 1 KB leaf, a longer one fills its overflow pages (a ``WITHOUT
    ROWID`` row spilled past ~230 bytes, its last overflow page half empty)."""

    __tablename__ = "metric_chunks"
    __table_args__ = _chunk_table_args("metric_chunks", rowid=True)


class OpenChunkRow(_ChunkColumns, Base):
    """The open ranges of running runs (0015): 16-step chunks and partial segments, rewritten by packs."""

    __tablename__ = OPEN_CHUNKS
    __table_args__ = _chunk_table_args(OPEN_CHUNKS, rowid=False)


# segments are compressed already: TOAST keeps them out of line but does not compress them again (0014, 0016)
for _row in (MetricChunkRow, OpenChunkRow):
    for _column in ("data", "data_ext"):
        _external = DDL(f"ALTER TABLE {_row.__tablename__} ALTER COLUMN {_column} SET STORAGE EXTERNAL")
        event.listen(_row.__table__, "after_create", _external.execute_if(dialect="postgresql"))


class MetricRollupRow(Base):
    __tablename__ = "metric_rollups"
    __table_args__ = ({"sqlite_with_rowid": False},)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    name_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    layer: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    level: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    block: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    n_points: Mapped[int] = mapped_column(Integer)
    min_step: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    min_tokens: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    min_value: Mapped[float | None] = mapped_column(Double, nullable=True)
    max_step: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    max_tokens: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    max_value: Mapped[float | None] = mapped_column(Double, nullable=True)


class SeriesLatestRow(Base):
    """The newest point of every series: what /metrics and the run overview read. On PostgreSQL a series'
    newer pending points are not in its row (since revision 0020): read it through :mod:`.latest`."""

    __tablename__ = "series_latest"
    # SQLite: one b-tree, not two (since revision 0017); PostgreSQL: room on each page for the next version of
    # every row, so a batch's update stays on its page and leaves the key alone (since 0018)
    __table_args__ = ({"sqlite_with_rowid": False, "postgresql_with": {"fillfactor": 50}},)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    name_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    layer: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    step: Mapped[int] = mapped_column(BigInteger)
    value: Mapped[float | None] = mapped_column(Double, nullable=True)


class PointBatchRow(Base):
    """A pending batch's points of one metric name (PostgreSQL; see monitor.store.pending): arrays, one
    element per point; tokens -1 = none, NaN as NaN. SQLite has the table (one schema) but never uses it."""

    __tablename__ = "point_batches"
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    name_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    token: Mapped[int] = mapped_column(BigInteger, primary_key=True)  # the run's ingest_token of the batch
    layer: Mapped[bytes] = mapped_column(Int2Array)
    step: Mapped[bytes] = mapped_column(Int8Array)
    tokens: Mapped[bytes] = mapped_column(Int8Array)
    value: Mapped[bytes] = mapped_column(Float8Array)


class IngestedBatchRow(Base):
    __tablename__ = "ingested_batches"
    # per run since revision 0007; since 0017 the id is ``points.batch_key`` (17 bytes for a 32-hex id,
    # not 32 characters), the time Unix milliseconds, and SQLite's table is clustered on the key (no
    # rowid, no second copy of the key in an automatic index): ~36 bytes a batch, not ~124. Since 0019
    # the hooks' sequence ids are claimed in ``batch_ranges`` instead, and a guard refuses them here
    __table_args__ = (PrimaryKeyConstraint("run_id", "batch_id"), {"sqlite_with_rowid": False})
    batch_id: Mapped[bytes] = mapped_column(LargeBinary(65))
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    n_points: Mapped[int] = mapped_column(Integer)
    received_ms: Mapped[int] = mapped_column(BigInteger)


class BatchRangeRow(Base):
    """The sequence batch ids a run has stored (revision 0019; ``monitor.store.claims``): per writer
    session, ranges of the numbers claimed, disjoint and never adjacent, so a session that sends its
    batches in order is one row however many requests it makes."""

    __tablename__ = "batch_ranges"
    __table_args__ = (PrimaryKeyConstraint("run_id", "session", "lo"), {"sqlite_with_rowid": False})
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    session: Mapped[bytes] = mapped_column(LargeBinary(16))
    lo: Mapped[int] = mapped_column(BigInteger)
    hi: Mapped[int] = mapped_column(BigInteger)
    n_points: Mapped[int] = mapped_column(BigInteger)  # received in the range's batches
    received_ms: Mapped[int] = mapped_column(BigInteger)  # the range's last batch


# what the detectors raise and where it goes (alert events, incidents, webhooks) is its own module;
# imported here so that Base.metadata holds every table whichever module a caller imports first
import hyperwatch.monitor.store.alert_models  # noqa: E402, F401
