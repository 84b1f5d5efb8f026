"""Training step time while the service is up vs down (SIGKILLed). Prints one line per figure.

A tiny bundled model trains on CPU with ``hooks.attach(..., every=1)`` streaming to a real
``hyperwatch serve`` child process over SQLite. The same number of steps is timed with the service
up, then after SIGKILL (the sink spools and retries in the background), then after a restart; the
median step times are printed side by side with their ratio. A ratio near 1.0 means the outage
costs the training loop nothing.

    .venv/bin/python bench/outage.py                 # 300 steps per phase
    .venv/bin/python bench/outage.py --steps 1000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hyperwatch import hooks  # noqa: E402
from hyperwatch.hooks.sinks import HttpSink  # noqa: E402
from hyperwatch.monitor.processes.children import ServiceProcess  # noqa: E402
from hyperwatch.monitor.store import SqlStore, migrate  # noqa: E402
from hyperwatch.trainer.model import ModelConfig, Transformer  # noqa: E402

TOKEN = "bench-outage-token-0123456789"


def service(db: str) -> ServiceProcess:
    """The service as a child process (the shared helper), write token set, ready on /healthz."""
    return ServiceProcess(
        db,
        dev=False,
        upgrade=False,
        extra_args=("--log-level", "warning"),
        env={"HYPERWATCH_WRITE_TOKEN": TOKEN},
        ready_path="/healthz",
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--steps", type=int, default=300, help="timed steps per phase (default 300)")
    args = p.parse_args()
    if args.steps < 10:
        p.error("--steps: at least 10")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    cfg = ModelConfig(depth=2, alpha=16, head_dim=8, vocab_size=64, seq_len=32, base_depth=2)
    model = Transformer(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 64, (4, 32))
    with tempfile.TemporaryDirectory() as tmp:
        db = f"sqlite:///{tmp}/outage.db"
        store = SqlStore(db)
        migrate.upgrade(store.engine)
        store.close()
        svc = service(db)
        with svc:
            run_phases(args.steps, model, opt, x, svc, Path(tmp))
    return 0


def run_phases(
    steps: int,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    x: torch.Tensor,
    svc: ServiceProcess,
    tmp: Path,
) -> None:
    sink = HttpSink(svc.url, token=TOKEN, spool=tmp / "spool", close_timeout=120)
    mon = hooks.attach(model, run="outage-bench", sink=sink, every=1)
    step = 0

    def phase(n: int) -> list[float]:
        nonlocal step
        times = []
        for _ in range(n):
            t = time.perf_counter()
            logits = model(x).logits  # (B, T, V)
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 64), x[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            mon.step(step, loss=loss.detach(), lr=1e-3, tokens=step * 128)
            times.append(time.perf_counter() - t)
            step += 1
        return times

    phase(20)  # warm-up
    up = phase(steps)
    svc.kill()  # SIGKILL: the service is gone mid-run
    down = phase(steps)
    spooled = len(list((tmp / "spool" / "outage-bench" / "pending").glob("*.json")))
    svc.start()  # same port, same database
    back = phase(steps)
    mon.close()
    svc.stop()
    m_up, m_down, m_back = (statistics.median(t) * 1000 for t in (up, down, back))
    print(f"outage step time (median, ms): down/up ratio {m_down / m_up:.3f} (down {m_down:.2f}, up {m_up:.2f})")
    print(f"outage step time (median, ms): after-restart/up ratio {m_back / m_up:.3f} ({m_back:.2f} vs {m_up:.2f})")
    p99 = [sorted(t)[int(0.99 * len(t))] * 1000 for t in (up, down)]
    print(f"outage step time (p99, ms): down/up ratio {p99[1] / p99[0]:.3f} (down {p99[1]:.2f}, up {p99[0]:.2f})")
    print(
        f"outage: {spooled} batches were in the spool at the restart; undelivered after close: "
        f"{len(list((tmp / 'spool' / 'outage-bench' / 'pending').glob('*.json')))}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
