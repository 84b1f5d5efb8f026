"""How long ``hyperwatch COMMAND --help`` takes, each command beside a bare interpreter start.

The target (issue 24) is under 0.5 s per command: a command's module imports torch, numpy, scipy or
FastAPI only when it runs, never to print its help. Prints one line per command: the median wall
time of ``--repeats`` runs, the ratio to the 0.5 s target, and ``python -c pass`` measured in the
same run (the floor every command pays).

    .venv/bin/python bench/cli_help.py               # every command, 5 runs each
    .venv/bin/python bench/cli_help.py --repeats 9
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from hyperwatch.cli import COMMANDS

TARGET_S = 0.5


def wall(argv: list[str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    floor = wall([sys.executable, "-c", "pass"], args.repeats)
    worst = 0.0
    for name in COMMANDS:
        t = wall([sys.executable, "-m", "hyperwatch", name, "--help"], args.repeats)
        worst = max(worst, t)
        print(
            f"hyperwatch {name} --help: {t:.3f} s median of {args.repeats} = {t / TARGET_S:.2f} x the 0.5 s target "
            f"(python -c pass: {floor:.3f} s)"
        )
    print(f"slowest --help: {worst:.3f} s = {worst / TARGET_S:.2f} x the 0.5 s target")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
