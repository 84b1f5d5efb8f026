"""A stand-in training process for the reliability tests: spools batches through a real HttpSink.

``python -m tests.reliability.trainer_proc URL SPOOL RUN --batches N --points P [--first-step S]
[--kill-after-delivered K]``: writes N batches of P points (``attention_z`` of layers 0..P-1 at
steps S..S+N-1), then either closes normally (delivering everything) or, with
``--kill-after-delivered``, spools them all first, then replays the spool to the service, waits
until K batches were acknowledged and SIGKILLs itself: the crash lands while the sender is in the
middle of the spool. Prints one JSON summary line on a
normal exit. Imports no torch: only the sink.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import time

from hyperwatch.hooks.schema import Batch, Point
from hyperwatch.hooks.sinks import HttpSink, RunInfo


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("spool")
    p.add_argument("run")
    p.add_argument("--batches", type=int, default=100)
    p.add_argument("--points", type=int, default=10)
    p.add_argument("--first-step", type=int, default=0)
    p.add_argument("--kill-after-delivered", type=int, default=None)
    p.add_argument("--token", default=None)
    args = p.parse_args()
    url, close_timeout = args.url, 120.0
    if args.kill_after_delivered is not None:
        # Spool every batch first (nothing listens at the first address), then let a sink on the real
        # service replay the spool and die mid-way: a sender writing live can be overtaken by a fast
        # service, which then holds every batch before the kill (seen once ingest got faster, issue 16).
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            url, close_timeout = f"http://127.0.0.1:{s.getsockname()[1]}", 0.1
    sink = HttpSink(url, token=args.token, spool=args.spool, backoff=(0.05, 0.5), close_timeout=close_timeout)
    # Each process continues the run of its name (resume=True), as a trainer restarted from its
    # checkpoint after a crash does; a new process without it would be refused (run identity).
    info = RunInfo(args.run, config={"proc": os.getpid()}, resume=True)
    sink.start(info)
    for i in range(args.batches):
        step = args.first_step + i
        sink.write(Batch(args.run, [Point("attention_z", step, float(j + step), layer=j) for j in range(args.points)]))
    if args.kill_after_delivered is not None:
        sink.close()  # everything stays in the spool
        # ten batches a request (the sink would merge the whole spool into one): K is reached mid-spool
        sink = HttpSink(args.url, token=args.token, spool=args.spool, backoff=(0.05, 0.5), max_points=10 * args.points)
        sink.start(info)
        deadline = time.monotonic() + 120
        while sink.delivered < args.kill_after_delivered and time.monotonic() < deadline:
            time.sleep(0.001)
        os.kill(os.getpid(), signal.SIGKILL)
    sink.finish("finished")
    done = sink.flush(120)
    sink.close()
    print(json.dumps({"delivered": sink.delivered, "flushed": done, "dropped": sink.dropped_points}))
    return 0 if done else 1


if __name__ == "__main__":
    raise SystemExit(main())
