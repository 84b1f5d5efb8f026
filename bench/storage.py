"""Storage of compressed segments against Prometheus' TSDB on the same samples, in one run (issue 36).

1. **Bytes per point**: issue 36's workload (``bench/storage_codecs.synthetic``: 8 indicators x 64
   layers x 2,000 steps, half float32-valued), the real-hooks fixture
   (``tests/monitor/alerting/data/ewf_series``: 13 runs of 50 logged steps, what short series cost) and
   one long real-hooks run (``bench/storage_hooks.py``: a 2,000-step run logged every step, 36 series
   as long as the run) posted through ``hyperwatch serve`` one step
   per request (binary columns body), then the run marked finished; SQLite's file after a checkpoint
   less its free pages (what packing freed, reused by the next writes) and PostgreSQL's user tables
   after VACUUM ANALYZE, each minus the empty schema, beside promtool's
   block (chunks + index) of the same samples (``bench/storage_codecs.tsdb``). Every point is read
   back and compared bit for bit (``lossless``). Then the same runs are posted again under other
   names: what the second pass adds to the whole file or tables (free space included) is what
   each further run costs a database that already holds one, i.e. capacity in steady state.
2. **Ingest**: the workload's points/s posted the same way into a fresh database against the raw
   one-transaction-per-step insert floor (``bench/ingest.py``: SQLite executemany, PostgreSQL COPY; 512
   points per transaction), ``--pairs`` times (3), each pair measured one right after the other and in
   alternating order; the ratio of each pair and their median (a single pair read 0.85x to 1.04x on
   different runs of this benchmark).
3. **Read**: a 2,000-bucket read of one 10^7-point series through the store (``bench/ingest.load_series``).

    .venv/bin/python bench/storage.py            # the issue's figures (~15 min on 2 shared cores)
    .venv/bin/python bench/storage.py --quick    # a small workload, both databases, under a minute
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import ingest
from bench.storage_codecs import fixture, synthetic, tsdb
from bench.storage_hooks import long_run
from hyperwatch.monitor.store import SqlStore, chunks
from hyperwatch.monitor.store.rollups import seal_rollups

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "monitor" / "alerting" / "data" / "ewf_series"
STEP_POINTS = 512  # the floor's transaction: one step of 8 x 64 series


def rows_of(series: list[dict]) -> list[tuple[str, int | None, int, float]]:
    """(name, layer, step, value), step-major: one step of every series after the other. Names go under
    ``user.`` (free names: the workload's and the fixture's sanitised names are not all hook names)."""
    out = [
        ("user." + s["metric"].removeprefix("hw_"), _layer(s["labels"]["layer"]), int(st), float(v))
        for s in series
        for st, v in zip(s["steps"].tolist(), s["values"].tolist(), strict=True)
    ]
    out.sort(key=lambda r: (r[2], r[0], -1 if r[1] is None else r[1]))
    return out


def runs_of(series: list[dict], title: str) -> dict[str, list[tuple[str, int | None, int, float]]]:
    """The rows of each run the series belong to (their ``run`` label): ``{title: rows}`` for series
    without one (the synthetic workload), else ``{title-0: rows, title-1: ...}``."""
    by_run: dict[str | None, list[dict]] = {}
    for s in series:
        by_run.setdefault(s["labels"].get("run"), []).append(s)
    if list(by_run) == [None]:
        return {title: rows_of(series)}
    return {f"{title}-{i}": rows_of(group) for i, group in enumerate(by_run.values())}


def _layer(text: str) -> int | None:
    return None if text == "None" else int(text)


def per_step(data: list[tuple[str, int, int, float]]) -> int:
    steps = {r[2] for r in data}
    return max(1, len(data) // max(1, len(steps)))


def post(url: str, runs: dict[str, list[tuple[str, int, int, float]]]) -> tuple[float, int, int]:
    """Post every run one step per request, finish it; (points/s, bytes before, bytes after finishing)."""
    with ingest.serve(url) as base:
        rate = post_rate(base, runs)
        running = ingest.bytes_on_disk(url)
        store = SqlStore(url)
        for name in runs:
            run = next(r for r in store.list_runs() if r.name == name)
            req = urllib.request.Request(
                f"{base}/api/v1/runs/{run.id}",
                data=json.dumps({"status": "finished"}).encode(),
                method="PATCH",
                headers={"Authorization": f"Bearer {ingest.TOKEN}", "Content-Type": "application/json"},
            )
            urllib.request.urlopen(req, timeout=120).read()
        store.close()
    return rate, running, ingest.bytes_on_disk(url)


def post_rate(base: str, runs: dict[str, list[tuple[str, int, int, float]]]) -> float:
    """Points/s posting every run one step per request to the service at ``base`` (over all runs' points)."""
    rates = [(len(data), ingest.http_rate(base, data, per_step(data), name)) for name, data in runs.items()]
    return sum(n for n, _r in rates) / sum(n / r for n, r in rates)


def lossless(url: str, runs: dict[str, list[tuple[str, int, int, float]]]) -> bool:
    store = SqlStore(url)
    ok = True
    with store.engine.connect() as conn:
        for name, data in runs.items():
            run = next(r for r in store.list_runs() if r.name == name)
            names = {n: store._name_id(conn, n, create=False) for n in {r[0] for r in data}}
            got = {(n, la, s): v for _r, n, la, s, _t, v in chunks.all_points(conn, run.id)}
            sent = np.array([r[3] for r in data])
            keys = [(names[r[0]], -1 if r[1] is None else r[1], r[2]) for r in data]
            found = [got.get(k, 0.0) for k in keys]
            back = np.array([math.nan if v is None else v for v in found], dtype=np.float64)
            same = (sent.view(np.uint64) == back.view(np.uint64)) | (np.isnan(sent) & np.isnan(back))
            same &= np.array([k in got for k in keys])
            ok &= bool(same.all()) and len(got) == len(data)
    store.close()
    return ok


def database(pg: bool, work: Path, label: str) -> tuple[str, object]:
    """A new, empty database: PostgreSQL's a context to exit; SQLite's a file of its own under ``work``."""
    if pg:
        ctx = ingest.pg_database()
        return ctx.__enter__(), ctx
    n = sum(1 for _ in work.glob(f"{label}-*.db"))
    return f"sqlite:///{work}/{label}-{n}.db", None


def free(url: str) -> int:
    """SQLite: the bytes of its free pages (left by packing, reused by later writes; 0 on PostgreSQL,
    whose VACUUM keeps the space in the tables, counted)."""
    if not url.startswith("sqlite"):
        return 0
    con = sqlite3.connect(url.removeprefix("sqlite:///"))
    pages, size = con.execute("PRAGMA freelist_count").fetchone()[0], con.execute("PRAGMA page_size").fetchone()[0]
    con.close()
    return int(pages) * int(size)


def in_use(url: str) -> int:
    """``bench/ingest.bytes_on_disk`` less SQLite's free pages."""
    size = ingest.bytes_on_disk(url)
    return size - free(url)


def bytes_figures(title: str, runs: dict, samples: int, tsdb_bpp: float, pg: bool, work: Path) -> dict:
    """Bytes per point of the runs posted into an empty database (``bpp``: finished; ``bpp_running``:
    before finishing), and of the same runs posted again under other names (``bpp_next``: the growth
    of the file or tables, free space included, from the first pass to the second: what each further
    run costs once the space the first one's packing freed is there to be reused)."""
    url, ctx = database(pg, work, title)
    try:
        ingest.fresh(url)
        empty = in_use(url)
        _rate, running, _ = post(url, runs)
        running, finished = running - free(url), in_use(url)
        ok = lossless(url, runs)
        first_whole = ingest.bytes_on_disk(url)
        again = {f"{name}-again": data for name, data in runs.items()}
        post(url, again)
        next_whole = ingest.bytes_on_disk(url)
        ok &= lossless(url, again)
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)  # type: ignore[attr-defined]
    return {
        "set": title, "db": "postgresql" if pg else "sqlite", "bpp": (finished - empty) / samples,
        "bpp_running": (running - empty) / samples, "bpp_next": (next_whole - first_whole) / samples,
        "tsdb": tsdb_bpp, "lossless": ok,
    }  # fmt: skip


def floor(pg: bool, steps: int, work: Path) -> float:
    data = ingest.rows(steps)
    url, ctx = database(pg, work, "floor")
    try:
        ingest.fresh(url)
        if pg:
            return ingest.raw_pg_rate(url.replace("+psycopg", ""), data, STEP_POINTS, 1000)
        return ingest.raw_sqlite_rate(url.removeprefix("sqlite:///"), data, STEP_POINTS, 1000)
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)  # type: ignore[attr-defined]


def http_ingest(pg: bool, runs: dict[str, list[tuple[str, int, int, float]]], work: Path) -> float:
    """Points/s posting ``runs`` one step per request into a fresh database through ``hyperwatch serve``."""
    url, ctx = database(pg, work, "http")
    try:
        ingest.fresh(url)
        with ingest.serve(url) as base:
            return post_rate(base, runs)
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)  # type: ignore[attr-defined]


def ingest_pairs(
    pg: bool, runs: dict[str, list[tuple[str, int, int, float]]], steps: int, work: Path, pairs: int
) -> list[tuple[float, float]]:
    """(HyperWatch points/s, raw floor points/s), ``pairs`` times, alternately (H F, F H, ...): each ratio
    from two measurements taken one after the other, so a machine that slows down mid-run slows both."""
    out = []
    for i in range(pairs):
        if i % 2 == 0:
            ours = http_ingest(pg, runs, work)
            out.append((ours, floor(pg, steps, work)))
        else:
            raw = floor(pg, steps, work)
            out.append((http_ingest(pg, runs, work), raw))
    return out


def read_ms(pg: bool, n: int, repeats: int, work: Path) -> float:
    url, ctx = database(pg, work, "read")
    try:
        ingest.fresh(url)
        store = SqlStore(url)
        run, _ = store.upsert_run("default", "big", {})
        with store.engine.begin() as conn:
            nid = store._name_id(conn, "attention_z")
        assert nid is not None
        ingest.load_series(store, run.id, nid, n)
        with store.engine.begin() as conn:
            seal_rollups(conn, run.id, {(nid, 0): None}, {(nid, 0): n - 1}, {}, from_level=3)
        if pg:
            ingest.vacuum(url)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            store.series(run.id, "attention_z", 0, 2000, None, None)
            times.append(time.perf_counter() - t0)
        store.close()
        return statistics.median(times) * 1000
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)  # type: ignore[attr-defined]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--quick", action="store_true", help="2 x 4 x 1,100 steps, 3 fixture runs, a 300-step hooks run, a 10^5 read"
    )
    ap.add_argument("--no-pg", action="store_true", help="SQLite only")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument(
        "--pairs", type=int, help="ingest measured against its floor this many times (default 3; --quick 1)"
    )
    args = ap.parse_args(argv)
    pairs = args.pairs if args.pairs is not None else (1 if args.quick else 3)
    if pairs < 1:
        ap.error(f"--pairs: at least 1, got {pairs}")
    if args.repeats < 1:
        ap.error(f"--repeats: at least 1, got {args.repeats}")
    ingest.BODY = "columns"  # NaN and +-Inf travel as themselves
    ind, layers, steps, n_read = (2, 4, 1100, 100_000) if args.quick else (8, 64, 2000, 10_000_000)
    promtool = shutil.which("promtool")
    hooks = fixture(FIXTURE)
    if args.quick:  # three of the 13 recorded runs
        hooks = [s for s in hooks if s["labels"]["run"] in sorted({h["labels"]["run"] for h in hooks})[:3]]
    sets = {
        "workload": synthetic(36, ind, layers, steps, 1, 0.02, 0.02),
        "fixture": hooks,
        "hooks-long": long_run(300 if args.quick else 2000),
    }
    dbs = [False] + ([] if args.no_pg else [True])
    out, speeds, reads = [], {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for title, series in sets.items():
            samples = sum(len(s["values"]) for s in series)
            (work / f"tsdb-{title}").mkdir()
            tsdb_bpp = tsdb(series, promtool, work / f"tsdb-{title}")["chunks_index"] if promtool else math.nan
            runs = runs_of(series, title)
            for pg in dbs:
                out.append(bytes_figures(title, runs, samples, tsdb_bpp, pg, work))
                print(f"  {title} on {out[-1]['db']}: {out[-1]['bpp']:.2f} B/pt", flush=True)
        # the ingest figure is always at the shape, one step of 8 x 64 points per request (--quick: fewer steps)
        ingest_steps = 300 if args.quick else steps
        workload = sets["workload"] if not args.quick else synthetic(36, 8, 64, ingest_steps, 1, 0.02, 0.02)
        for pg in dbs:
            speeds[pg] = ingest_pairs(pg, runs_of(workload, "ingest"), ingest_steps, work, pairs)
            reads[pg] = read_ms(pg, n_read, args.repeats, work)
    print("\n| data | database | B/pt finished (running) | vs TSDB | B/pt the same runs again | vs TSDB | TSDB B/pt "
          "| lossless |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for r in out:
        first, again = r["bpp"] / r["tsdb"], r["bpp_next"] / r["tsdb"]
        print(f"| {r['set']} | {r['db']} | {r['bpp']:.2f} ({r['bpp_running']:.2f}) | {first:.2f}x | "
              f"{r['bpp_next']:.2f} | {again:.2f}x | {r['tsdb']:.2f} | {r['lossless']} |")  # fmt: skip
    print(f"\n| database | ingest pts/s (workload, 1 step/request) | raw floor pts/s | ratio, each pair | median "
          f"of {pairs} | target |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for pg in dbs:
        ours, raw = [a for a, _b in speeds[pg]], [b for _a, b in speeds[pg]]
        ratios = [a / b for a, b in speeds[pg]]
        print(f"| {'postgresql' if pg else 'sqlite'} | {', '.join(f'{a:,.0f}' for a in ours)} | "
              f"{', '.join(f'{b:,.0f}' for b in raw)} | {', '.join(f'{x:.2f}x' for x in ratios)} | "
              f"{statistics.median(ratios):.2f}x | >= {0.8 if pg else 1.0} |")  # fmt: skip
    print(f"\n| database | 2,000-bucket read of {n_read:,} points (median of {args.repeats}) | target |")
    print("|---|---|---|")
    for pg in dbs:
        print(f"| {'postgresql' if pg else 'sqlite'} | {reads[pg]:.1f} ms | <= 50 ms |")
    return 0 if all(r["lossless"] for r in out) else 1


if __name__ == "__main__":
    sys.exit(main())
