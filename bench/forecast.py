"""Forecasts across scale, checked against runs that exist: leave-one-size-out, and the read's latency.

1. **Trainer sweep** (``bench/forecast_sweep.py``, cached under ``runs/bench-forecast/``): the demo's
   two arms at depths 2..6 (157K-3.3M parameters, 32 steps of 8,192 tokens each), read back through
   the service's API (``GET /api/v1/groups/{id}/forecast``: each run's peak attention Z, mean over
   layers as the scale page shows it by default, and max over layers, at its end). For every size
   from the fourth on, the forecast fitted on all the smaller sizes is compared with the size's own
   peak: error and whether the truth fell inside the 90% band. Then the crossing of the threshold
   (attention Z 1,000): the fit on all but the largest size against where the measured peaks cross
   it (log-log between the two sizes around it), when they do.
   Targets: the largest size inside its band for both arms; the baseline arm forecast to break
   and the HyperP arm not; the crossing within 2x of the measured one.
   The demo's own depths (2, 3, 4) leave two sizes when one is left out: below the three-size
   minimum, which the script says rather than forecasting. The two smallest depths also run with
   seeds 1, 2, 3: how far one run's peak moves between seeds (the band's noise floor).
2. **Latency**: a group of 8 runs x ~10^5 points (the seven stability indicators, two layers, 7,200
   steps; a noisy power law in size), served by uvicorn on SQLite: ``GET .../forecast`` (all seven
   indicators) against the plain group read it builds on, ``GET .../stability`` (the same lines),
   median of ``--repeats`` requests each, side by side. Target: < 200 ms. The same leave-one-size-out
   runs on this synthetic group (a known law) as a check of the script itself.

    .venv/bin/python bench/forecast.py                      # sweep (cached) + latency
    .venv/bin/python bench/forecast.py --skip-sweep --steps 200 --repeats 3   # the suite's short version
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.forecast_sweep import OUT, group_name, run_arms, service  # noqa: E402
from hyperwatch.hooks.schema import Point  # noqa: E402
from hyperwatch.monitor.analysis.forecast import SIGMA_FLOOR, fmt_size, fmt_value, forecast  # noqa: E402
from hyperwatch.monitor.read.forecasts import DEFAULT_BUCKETS, collect  # noqa: E402
from hyperwatch.monitor.read.lines import STABILITY_INDICATORS  # noqa: E402
from hyperwatch.monitor.store import SqlStore, migrate  # noqa: E402
from tests.web.conftest import serve  # noqa: E402

TARGET_MS = 200.0
THRESHOLD = 1000.0
NAME = "attention_z"


def _num(v: Any) -> float:
    return float("nan") if isinstance(v, str) else float(v)


def peaks(base: str, group: str, agg: str = "mean") -> list[tuple[str, float, float]]:
    """(run, params, peak attention Z) per size of ``group``, read through the API's forecast."""
    with httpx.Client(base_url=base, timeout=120) as c:
        gid = next(g["id"] for g in c.get("/api/v1/groups").raise_for_status().json() if g["name"] == group)
        query = {"name": NAME, "agg": agg}
        body = c.get(f"/api/v1/groups/{gid}/forecast", params=query).raise_for_status().json()
    points = body["indicators"][NAME]["peak"]["points"]
    return [("/".join(p["runs"]), float(p["size"]), _num(p["value"])) for p in points]


def measured_crossing(table: list[tuple[str, float, float]]) -> float | None:
    """Where the measured peaks first reach the threshold (log-log between the sizes around it)."""
    for (_, x0, y0), (_, x1, y1) in itertools.pairwise(table):
        if y0 < THRESHOLD <= y1:
            w = math.log(THRESHOLD / y0) / math.log(y1 / y0)
            return math.exp(math.log(x0) + w * math.log(x1 / x0))
    return table[0][1] if table and table[0][2] >= THRESHOLD else None


def leave_one_size_out(label: str, table: list[tuple[str, float, float]]) -> dict[str, Any]:
    """Each size from the fourth on forecast from all the smaller ones; the crossing from all but the last."""
    out: dict[str, Any] = {"rows": []}
    sizes = [t[1] for t in table]
    print(f"{label}: peak {NAME} " + ", ".join(f"{fmt_size(s)} {fmt_value(v)}" for _, s, v in table))
    for k in range(2, len(table)):
        run, size, truth = table[k]
        f = forecast(NAME, sizes[:k], [t[2] for t in table[:k]], [t[0] for t in table[:k]], target=size,
                     threshold=THRESHOLD)  # fmt: skip
        if f.predicted is None:
            print(f"  {run} ({fmt_size(size)}) from {k} smaller sizes: {f.reason}")
            continue
        assert f.lower is not None and f.upper is not None
        inside = f.lower <= truth <= f.upper
        err = abs(f.predicted - truth) / truth
        out["rows"].append({"run": run, "size": size, "truth": truth, "predicted": f.predicted, "inside": inside})
        print(f"  {run} ({fmt_size(size)}) from {k} smaller sizes: predicted {fmt_value(f.predicted)} "
              f"(90% band {fmt_value(f.lower)}-{fmt_value(f.upper)}), measured {fmt_value(truth)}: "
              f"error {err:.0%}, inside the band: {'yes' if inside else 'NO'}")  # fmt: skip
    if len(table) >= 4:
        f = forecast(NAME, sizes[:-1], [t[2] for t in table[:-1]], [t[0] for t in table[:-1]], threshold=THRESHOLD)
        c = f.crossing
        real = measured_crossing(table)
        out["breaks"] = c is not None and c.status in ("crosses", "above")
        words = "no fit" if c is None else {"crosses": f"crosses at {fmt_size(c.size or 0)}", "above": "above already",
                                            "never": "never (within 1000x)"}[c.status]  # fmt: skip
        line = f"  threshold {fmt_value(THRESHOLD)} from the {len(table) - 1} smaller sizes: {words}"
        if real is not None:
            line += f"; measured: crosses at {fmt_size(real)}"
            if c is not None and c.size is not None:
                ratio = max(c.size / real, real / c.size)
                out["crossing_ratio"] = ratio
                line += f"; ratio {ratio:.2f}x (target within 2x: {'yes' if ratio <= 2 else 'NO'})"
        else:
            line += "; measured: never crosses within the sweep"
        print(line)
    return out


def seed_spread(url: str, arm: str) -> None:
    """Each size's peak over seeds (the sweep's seed 1337 and the seeds group's): the noise of one run."""
    store = SqlStore(url)
    try:
        by_size: dict[float, list[float]] = {}
        for group in (group_name(arm), group_name(arm, seeds=True)):
            gid = next(g.id for g in store.list_groups() if g.name == group)
            for _, size, peak, _ in collect(store, gid, [NAME]).points.get(NAME, []):
                by_size.setdefault(size, []).append(peak)
    finally:
        store.close()
    for size, values in sorted(by_size.items()):
        if len(values) > 1:
            sd = float(np.std(np.log(values), ddof=1))
            print(f"  seeds at {fmt_size(size)}: peaks {', '.join(fmt_value(v) for v in values)}: sd of ln {sd:.2f} "
                  f"(the band's floor: {SIGMA_FLOOR})")  # fmt: skip


def sweep(depths: list[int], out: Path, seeds: list[int]) -> bool:
    """Part 1; True when every target is met."""
    ok = True
    with service(out) as svc:
        t0 = time.perf_counter()
        run_arms(svc.url, depths, out)
        if seeds:
            run_arms(svc.url, depths[:2], out, seeds=seeds)
        print(f"sweep: the demo's two arms at depths {depths} (and {depths[:2]} with seeds {seeds}) ready in "
              f"{time.perf_counter() - t0:.0f} s (cached under {out})")  # fmt: skip
        results = {}
        for agg in ("mean", "max"):
            for arm in ("baseline", "hyperp"):
                table = peaks(svc.url, group_name(arm), agg)
                results[arm, agg] = leave_one_size_out(f"{arm} arm, {agg} over layers", table)
                if agg == "mean":
                    demo = [t for t in table if t[0].rsplit("-d", 1)[1] in ("2", "3", "4")]
                    two = demo[:2]
                    f = forecast(NAME, [t[1] for t in two], [t[2] for t in two], [t[0] for t in two])
                    print(f"  the demo's own depths 2, 3, 4: d=4 from d=2 and 3: {f.reason}")
                    if seeds:
                        seed_spread(f"sqlite:///{out / 'hyperwatch.db'}", arm)
    for (arm, agg), res in results.items():
        last = res["rows"][-1] if res["rows"] else None
        inside = bool(last and last["inside"])
        breaks = res.get("breaks")
        want = arm == "baseline"
        line = (f"target {arm} ({agg} over layers): largest size inside its band: "
                f"{'met' if inside else 'MISSED'}; forecast {'to break' if breaks else 'not to break'} "
                f"({'met' if breaks == want else 'MISSED'})")  # fmt: skip
        ok = ok and inside and breaks == want
        if "crossing_ratio" in res:
            met = res["crossing_ratio"] <= 2.0
            line += f"; crossing within 2x of the measured one: {'met' if met else 'MISSED'}"
            ok = ok and met
        print(line)
    return ok


def seed_latency_group(store: SqlStore, steps: int, layers: int = 2, seed: int = 0) -> int:
    """8 finished runs: every stability indicator per layer, a noisy power law in size, growing over steps."""
    rng = np.random.default_rng(seed)
    for depth in range(6, 22, 2):
        params = 12 * (128 * depth) ** 2 * depth
        fields = {"group": "forecast-latency", "depth": depth, "total_params": params, "total_steps": steps,
                  "tokens": 4096 * steps, "flops": 6.0 * params * 4096 * steps, "status": "finished"}  # fmt: skip
        run, _ = store.upsert_run("bench", f"d{depth}", fields)
        noise = math.exp(rng.normal(0, 0.1))
        pts: list[Point] = []
        for step in range(steps):
            grow = 0.5 + (step + 1) / steps
            for i, name in enumerate(STABILITY_INDICATORS):
                v = (1 + i) * 1e-3 * params**0.4 * grow * noise
                pts.extend(Point(name, step, v * (1 + 0.1 * la), layer=la) for la in range(layers))
            if len(pts) >= 50_000:
                store.ingest(run.id, uuid.uuid4().hex, pts)
                pts = []
        if pts:
            store.ingest(run.id, uuid.uuid4().hex, pts)
    return store.list_groups("bench")[0].id


def latency(steps: int, repeats: int) -> bool:
    """Part 2; True when the forecast answers under the target."""
    with tempfile.TemporaryDirectory() as tmp:
        store = SqlStore(f"sqlite:///{Path(tmp) / 'forecast.db'}")
        migrate.upgrade(store.engine)
        t0 = time.perf_counter()
        gid = seed_latency_group(store, steps)
        points = steps * 2 * len(STABILITY_INDICATORS)
        print(f"latency group: 8 runs x {points:,} points seeded in {time.perf_counter() - t0:.0f} s")
        server, thread, base = serve(store)
        try:
            with httpx.Client(base_url=base, timeout=300) as c:
                times: dict[str, list[float]] = {"forecast": [], "stability": []}
                same = {"buckets": DEFAULT_BUCKETS}  # the same lines: each run's, 200 buckets
                for _ in range(repeats + 1):
                    for what, params in (("forecast", {"params": 7e9, **same}), ("stability", same)):
                        t = time.perf_counter()
                        c.get(f"/api/v1/groups/{gid}/{what}", params=params).raise_for_status()
                        times[what].append(time.perf_counter() - t)
                fc = c.get(f"/api/v1/groups/{gid}/forecast").raise_for_status().json()
        finally:
            server.should_exit = True
            thread.join(10)
            store.close()
    cold = 1000 * times["forecast"][0]
    f_ms, s_ms = (1000 * statistics.median(times[k][1:]) for k in ("forecast", "stability"))
    what = f"forecast of 8 runs x {points:,} points, 7 indicators"
    print(f"{what}: {f_ms:.0f} ms vs the plain group read (stability, same lines) {s_ms:.0f} ms = "
          f"{f_ms / s_ms:.2f}x; target {TARGET_MS:.0f} ms = {f_ms / TARGET_MS:.2f}x of the target (median of "
          f"{repeats}; each run's lines are kept until the run changes)")  # fmt: skip
    print(f"{what}, first request (reads every line): {cold:.0f} ms vs the plain group read {s_ms:.0f} ms = "
          f"{cold / s_ms:.2f}x")  # fmt: skip
    table = [("/".join(p["runs"]), p["size"], _num(p["value"])) for p in fc["indicators"][NAME]["peak"]["points"]]
    leave_one_size_out("latency group (a known law, sigma 0.1)", table)
    return f_ms < TARGET_MS


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--depths", default="2,3,4,5,6", help="the sweep's depths (default 2..6)")
    ap.add_argument("--out", type=Path, default=OUT, help="the sweep's cache folder")
    ap.add_argument("--seeds", default="1,2,3", help="seeds of the two smallest depths (the seed spread)")
    ap.add_argument("--skip-sweep", action="store_true", help="the latency part only")
    ap.add_argument("--steps", type=int, default=7200, help="steps per run of the latency group (x14 points)")
    ap.add_argument("--repeats", type=int, default=20, help="requests timed per endpoint (median)")
    args = ap.parse_args()
    ok = True
    if not args.skip_sweep:
        seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else []
        ok = sweep([int(d) for d in args.depths.split(",")], args.out, seeds)
    ok = latency(args.steps, args.repeats) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
