"""How long an existing database takes to go through migration 0006 (and back), and that no point is lost.

0006 packs a SQLite database's sealed points into chunks (one row per point before it) and unpacks them
on downgrade; on PostgreSQL it only adds columns, a table and a view. This builds a database at head with
``--steps`` x 512 series (8 indicators x 64 layers) through the store, downgrades it to 0005 (every
point becomes a row again: the state a user upgrading from 0005 starts from), then upgrades it to head,
timing both, and compares every point read back before and after (``chunks.all_points``: hot rows and
chunks alike) and the file's size.

    .venv/bin/python bench/migration.py                   # 2,000 steps: 1,024,000 points, SQLite
    .venv/bin/python bench/migration.py --steps 20000     # 10^7 points
    .venv/bin/python bench/migration.py --pg              # the same on PostgreSQL
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import create_engine

from bench.ingest import bytes_on_disk, pg_database
from hyperwatch.hooks.columns import PointColumns
from hyperwatch.monitor.store import SqlStore, chunks, migrate

NAMES = ("attention_z", "router_z", "attn_rms", "mlp_rms", "outlier_rate", "max_vio", "q_rms", "k_rms")
LAYERS = 64
STEPS_PER_BATCH = 8  # 4,096 points per batch


def fill(store: SqlStore, steps: int) -> None:
    store.upsert_run("default", "migrate-1", {})
    per_step = len(NAMES) * LAYERS
    name_index = np.repeat(np.arange(len(NAMES), dtype=np.int32), LAYERS)
    layer = np.tile(np.arange(LAYERS, dtype=np.int64), len(NAMES))
    rng = np.random.default_rng(0)
    for first in range(0, steps, STEPS_PER_BATCH):
        n = min(STEPS_PER_BATCH, steps - first)
        step = np.repeat(np.arange(first, first + n, dtype=np.int64), per_step)
        value = rng.normal(1.0, 0.1, n * per_step)
        value[::9973] = np.nan  # training facts the migration must carry
        cols = PointColumns(NAMES, np.tile(name_index, n), step, value, np.tile(layer, n), step * 4096)
        store.ingest_named("default", "migrate-1", uuid.uuid4().hex, cols)


def snapshot(store: SqlStore) -> list[tuple[object, ...]]:
    with store.engine.connect() as conn:
        return sorted(chunks.all_points(conn), key=repr)


def _comparable(point: tuple[object, ...]) -> tuple[object, ...]:
    return tuple("nan" if isinstance(x, float) and x != x else x for x in point)


def vacuum(url: str) -> None:
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("VACUUM")
    finally:
        engine.dispose()


def timed(what: str, points: int, fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    print(f"{what:<34} {dt:8.1f} s   {points / dt:>10,.0f} points/s")
    return dt


def run(url: str, steps: int) -> bool:
    points = steps * len(NAMES) * LAYERS
    store = SqlStore(url)
    try:
        migrate.upgrade(store.engine)
        timed(f"fill at head ({points:,} points)", points, lambda: fill(store, steps))
        before = snapshot(store)
        print(f"{'size at head':<34} {bytes_on_disk(url) / points:8.1f} bytes/point")
        timed("downgrade to 0005", points, lambda: migrate.downgrade(store.engine, "0005_metric_chunks"))
        print(f"{'size at 0005':<34} {bytes_on_disk(url) / points:8.1f} bytes/point")
        timed("upgrade 0005 -> 0006 (head)", points, lambda: migrate.upgrade(store.engine))
        print(f"{'size at head again':<34} {bytes_on_disk(url) / points:8.1f} bytes/point")
        timed("VACUUM (gives freed pages back)", points, lambda: vacuum(url))
        print(f"{'size after VACUUM':<34} {bytes_on_disk(url) / points:8.1f} bytes/point")
        after = snapshot(store)
    finally:
        store.close()
    same = len(before) == len(after) == points and list(map(_comparable, before)) == list(map(_comparable, after))
    print(f"{'points read back':<34} {len(after):,} of {points:,}, identical: {same}")
    return same


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=2000, help="steps of 512 points each (default 2000)")
    ap.add_argument("--pg", action="store_true", help="PostgreSQL at 127.0.0.1:5432 instead of SQLite")
    args = ap.parse_args()
    if args.steps < 1:
        ap.error(f"--steps: must be >= 1, got {args.steps}")
    if not args.pg:
        with tempfile.TemporaryDirectory() as tmp:
            return 0 if run(f"sqlite:///{tmp}/migrate.db", args.steps) else 1
    with pg_database() as url:
        return 0 if run(url, args.steps) else 1


if __name__ == "__main__":
    sys.exit(main())
