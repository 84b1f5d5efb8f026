"""Cut recorded runs of the family benchmark down to what the alert rules read: the suite's fixtures.

``tests/monitor/alerting/data/ewf_series/<run>.json.gz`` holds, per run, the batches the hooks sent (only the
indicators some rule reads: :data:`RULE_INPUTS`, per-head LSE included) and the run's own
``hyperwatch_run_*`` gauges as scraped after every logged step, so the suite can replay a real run
through the service and through promtool without training it.

    .venv/bin/python bench/early_warning/ew_fixture.py runs/bench/ewf parallel-best-s0 neox-lr_x4-s0 ... \\
        --out tests/monitor/alerting/data/ewf_series
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections.abc import Sequence
from pathlib import Path

RULE_INPUTS = (
    "loss",
    "grad_norm",
    "attention_z",
    "attention_lse_max",
    "output_z",
    "router_z",
    "attention_rms",
    "mlp_rms",
    "max_vio",
)
KEEP_RUN = ("name", "family", "arm", "seed", "steps", "onset", "reference", "fault", "losses", "logged_steps")


def cut(doc: dict[str, object]) -> dict[str, object]:
    """The run with only the rules' inputs in its batches and only ``hyperwatch_run_*`` gauges."""
    batches = [
        [p for p in batch if str(p[0]).split(".h", 1)[0] in RULE_INPUTS]
        for batch in doc["batches"]  # type: ignore[attr-defined]
    ]
    scrapes = {k: v for k, v in doc["scrapes"].items() if k.startswith("hyperwatch_run_")}  # type: ignore[attr-defined]
    return {**{k: doc[k] for k in KEEP_RUN}, "batches": batches, "scrapes": scrapes}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir", type=Path, help="a recording of bench/early_warning/ew_record.py (DIR/runs/<name>.json)")
    p.add_argument("runs", nargs="+", help="run names to keep")
    p.add_argument("--out", type=Path, required=True, help="folder for <run>.json.gz")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.runs:
        src = args.dir / "runs" / f"{name}.json"
        if not src.is_file():
            print(f"ew_fixture: {src} not found: name a run of the recording (ls {args.dir}/runs)", file=sys.stderr)
            return 2
        body = json.dumps(cut(json.loads(src.read_text())), separators=(",", ":")).encode()
        (args.out / f"{name}.json.gz").write_bytes(gzip.compress(body, mtime=0))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
