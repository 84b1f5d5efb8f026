"""The training runs ``bench/forecast.py`` forecasts: the demo's two arms across more depths.

Both arms of ``make demo`` (``configs/cpu/demo_baseline.toml``: MuonH without HyperP or QK-Norm at
a too-high LR; ``configs/cpu/demo_hyperp.toml``: MuonH + HyperP with QK-Norm), each at the depths
given (default 2..6: five sizes, 157K to 3.3M parameters), streamed into a service on a SQLite file
under ``runs/bench-forecast/`` like the demo's own runs. Results are cached there: a second call
skips every finished run (the sweep runner's own resume) and reuses the database.

    .venv/bin/python bench/forecast_sweep.py --depths 2,3,4,5,6
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hyperwatch.monitor.processes.children import ServiceProcess  # noqa: E402
from hyperwatch.trainer.demo import DEMO_SWEEPS, DEMO_THRESHOLDS  # noqa: E402
from hyperwatch.trainer.sweep import expand, load_sweep, run_sweep, threads_per_run  # noqa: E402

OUT = ROOT / "runs" / "bench-forecast"
ARMS = {"baseline": DEMO_SWEEPS[1], "hyperp": DEMO_SWEEPS[0]}
"""arm -> the demo's sweep file (its [base] settings; the depths come from the command line)."""


def group_name(arm: str, seeds: bool = False) -> str:
    return f"forecast-{'seeds-' if seeds else ''}{arm}"


def _post(url: str, path: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(f"{url}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def run_arms(url: str, depths: list[int], out: Path, progress: bool = False, seeds: list[int] | None = None) -> None:
    """Both arms side by side (one process each, the cores shared), finished runs skipped; with
    ``seeds``, each depth once per seed (``train.seed``) in the arm's "seeds" group."""
    sweeps = []
    threads = threads_per_run(len(ARMS))
    for arm, path in ARMS.items():
        sweep = load_sweep(path)
        sweep.name = group_name(arm, seeds is not None)
        sweep.grid["depth"] = depths
        if seeds is not None:
            sweep.grid["train.seed"] = seeds
        sweep.base.setdefault("train", {}).setdefault("threads", threads)
        sweep.runs = expand(sweep)
        sweep.out_dir = str(out / "sweeps")
        sweep.server = url
        if not progress:
            sweep.on_progress = lambda _line: None
        _post(url, "/api/v1/groups", {"name": sweep.name, "thresholds": DEMO_THRESHOLDS})
        sweeps.append(sweep)
    with ThreadPoolExecutor(max_workers=len(sweeps)) as pool:
        for sweep, results in zip(sweeps, pool.map(run_sweep, sweeps), strict=True):
            bad = [r.name for r in results if r.status not in ("finished", "skipped")]
            if bad:
                raise RuntimeError(f"{sweep.name}: runs did not finish: {bad}; see their train.log under {out}")


def service(out: Path) -> ServiceProcess:
    """The bench's service on its cached SQLite file (schema upgraded first)."""
    out.mkdir(parents=True, exist_ok=True)
    return ServiceProcess(f"sqlite:///{out / 'hyperwatch.db'}", log_path=out / "service.log")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--depths", default="2,3,4,5,6", help="comma-separated depths (default 2..6)")
    p.add_argument("--out", type=Path, default=OUT, help="cache folder (database, checkpoints, logs)")
    p.add_argument("--seeds", default="", help="comma-separated seeds: each depth once per seed (seed spread)")
    args = p.parse_args()
    depths = [int(d) for d in args.depths.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else None
    with service(args.out) as svc:
        try:
            run_arms(svc.url, depths, args.out, progress=True, seeds=seeds)
        except urllib.error.URLError as exc:
            print(f"bench/forecast_sweep.py: the service did not answer: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
