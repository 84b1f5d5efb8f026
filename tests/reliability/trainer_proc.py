"""A stand-in training process for the reliability tests: spools batches through a real HttpSink.

``python -m tests.reliability.trainer_proc URL SPOOL RUN --batches N --points P [--first-step S]
[--kill-after-delivered K]``: writes N batches of P points (``attention_z`` of layers 0..P-1 at
steps S..S+N-1), then either closes normally (delivering everything) or, with
``--kill-after-delivered``, waits until K batches were acknowledged and SIGKILLs itself: the
crash lands while the sender is in the middle of the spool. Prints one JSON summary line on a
normal exit. Imports no torch: only the sink.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
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
    sink = HttpSink(args.url, token=args.token, spool=args.spool, backoff=(0.05, 0.5), close_timeout=120)
    sink.start(RunInfo(args.run, config={"proc": os.getpid()}))
    for i in range(args.batches):
        step = args.first_step + i
        sink.write(Batch(args.run, [Point("attention_z", step, float(j + step), layer=j) for j in range(args.points)]))
    if args.kill_after_delivered is not None:
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
