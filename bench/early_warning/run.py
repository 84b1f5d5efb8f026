"""Do the alerts come before the loss goes wrong? A sweep of runs that go wrong and their healthy twins.

Every run streams into a real ``hyperwatch serve`` (SQLite in a temporary folder) through the
hooks' HTTP sink, exactly as the README's three lines do, on CPU with tiny models (2-3 layers,
width 64, 64-byte windows of the Python standard library's sources, AdamW without clipping).
Scenarios, each with healthy twins in the same cell (same scenario, same model source):

- ``attn_growth``: LR x QK-norm (Wortsman et al. 2023), plain GPT and the bundled trainer;
- ``output_logits``: a high LR with z-loss off vs 1e-4, plain GPT and a Hugging Face Llama;
- ``moe_collapse``: the bundled trainer's MoE with and without SqrtGate + aux loss, LR x 10;
- ``nan``: LRs that diverge (plain GPT, Hugging Face Llama);
- ``loss_spike``: the LR x 30 for 5% of training at mid-run (all three sources).

Ground truth from the loss alone (``bench/early_warning/ew_score.py``) for every rule that guards the loss. The
MaxVio rules guard expert load, so they are judged by it, in their own table: the tokens each MoE
layer routed to each expert, read every step by this script's own forward hook on the trainer's
MoE layers (never from an alert), summed over the last 10% of the steps. Two alert sources are scored: the
service's detectors (``GET /api/v1/alerts``, the first step any alert names) and the Prometheus
rules of ``prometheus/rules.yml``, evaluated by ``promtool test rules`` over the ``/metrics``
scrapes taken after every logged step (``bench/early_warning/ew_prom.py``). Prints the table; ``--out`` writes
it (and every run's losses and first warnings) as JSON.

    nice -n 10 .venv/bin/python bench/early_warning/run.py --out runs/early_warning.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
from ew_models import RunSpec, batches, build, param_count, stdlib_bytes, z_loss  # noqa: E402
from ew_prom import PAGING, Scrape, replay, scrape, service_alerts, to_columns  # noqa: E402
from ew_score import (  # noqa: E402
    EFFICIENCY_RULES,
    RunResult,
    clear_false_alarms,
    expert_load_truth,
    first_loss_warning,
    format_efficiency,
    format_table,
    ground_truth,
    score,
    score_efficiency,
    totals,
)

from hyperwatch import hooks  # noqa: E402
from hyperwatch.monitor.processes.children import ServiceProcess  # noqa: E402
from hyperwatch.trainer.moe import MoE  # noqa: E402

PROJECT = "default"  # the sink posts points without ?project= (see the report): runs stay in "default"
RULES = ROOT / "prometheus" / "rules.yml"
ALERT_SOURCES = ("service", "prometheus")
DATA_SEED = 1234


def sweep(steps: int, seeds: int, offset: int = 0) -> list[RunSpec]:
    """The runs: per cell, its healthy arm (``seeds`` seeds, a safe LR) and the arms that may go wrong.

    A healthy arm shared by several cells (the same model at the same LR) is trained once. Init
    seeds start at ``offset`` (the healthy arm's ``offset`` .. ``offset + seeds - 1``, the other arms
    ``offset``): a held-out seed set for checking a calibration.
    """
    runs: list[RunSpec] = []

    def add(scenario: str, source: str, arm: str, lr: float, healthy: bool = False, **kw: Any) -> None:
        for seed in range(offset, offset + (seeds if healthy else 1)):
            runs.append(RunSpec(scenario, source, arm, lr, steps, seed=seed, healthy=healthy, **kw))

    safe = {"gpt": 3e-3, "trainer": 3e-3, "hf": 1e-3}
    for source, depth in (("gpt", 3), ("trainer", 2)):
        add("attn_growth", source, "safe-qk", safe[source], True, depth=depth)
        for lr in (3e-2, 1e-1):
            add("attn_growth", source, f"lr{lr:g}-qk", lr, depth=depth)
            add("attn_growth", source, f"lr{lr:g}-noqk", lr, depth=depth, qk_norm=False)
    for source in ("gpt", "hf"):
        add("output_logits", source, "safe-qk" if source == "gpt" else "safe", safe[source], True)
        for z in (0.0, 1e-4):
            add("output_logits", source, f"lr0.1-z{z:g}", 0.1, z_loss=z)
    add("moe_collapse", "trainer", "safe-gates", 3e-3, True, depth=2, moe=True)
    for lr in (3e-2, 1e-1):
        add("moe_collapse", "trainer", f"lr{lr:g}-gates", lr, depth=2, moe=True)
        add("moe_collapse", "trainer", f"lr{lr:g}-nogates", lr, depth=2, moe=True, gates=False)
    for source in ("gpt", "hf"):
        add("nan", source, "safe-qk" if source == "gpt" else "safe", safe[source], True)
        for lr in (1.0, 3.0):
            add("nan", source, f"lr{lr:g}", lr)
    for source, depth in (("gpt", 3), ("hf", 3), ("trainer", 2)):
        add("loss_spike", source, "safe-qk" if source != "hf" else "safe", safe[source], True, depth=depth)
        add("loss_spike", source, "safe-bump30", safe[source], depth=depth, lr_bump=(0.5, 0.55, 30.0))
    return runs


def train(
    spec: RunSpec, data: Any, url: str, every: int, seq: int, batch: int, spool: Path, data_seed: int
) -> dict[str, Any]:
    """One run through the hooks into the service; the loss every step, ``/metrics`` every logged step."""
    model, forward = build(spec, seq)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=(0.9, 0.95), weight_decay=0.1)
    config = {k: v for k, v in vars(spec).items() if k != "extra"}
    mon = hooks.attach(
        model, run=spec.name, sink=url, every=every, config=config,
        group=f"ew-{spec.scenario}", depth=spec.depth, spool=spool,
    )  # fmt: skip
    routed: list[list[list[int]]] = []  # per step, per MoE layer, tokens per expert (the load's ground truth)
    this_step: list[list[int]] = []

    def record(module: torch.nn.Module, args: Any, output: Any) -> None:
        assert isinstance(module, MoE) and module.counts is not None
        this_step.append(module.counts.tolist())

    handles = [m.register_forward_hook(record) for m in model.modules() if isinstance(m, MoE)]
    xs = batches(data, data_seed, spec.steps, batch, seq)  # every run sees the same batches; seeds vary the init
    losses: list[float] = []
    scrapes: list[Scrape] = []
    logged: list[int] = []
    nonfinite_at: int | None = None
    t0 = time.perf_counter()
    waited = 0.0  # in flush + scrape
    for step in range(spec.steps):
        lr = spec.lr_at(step)
        for g in opt.param_groups:
            g["lr"] = lr
        this_step.clear()
        logits, loss = forward(xs[step])
        if handles:
            routed.append(list(this_step))
        total = loss + spec.z_loss * z_loss(logits) if spec.z_loss else loss
        total.backward()
        opt.step()
        mon.step(step, loss=loss.detach(), lr=lr, tokens=(step + 1) * batch * seq)
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step % every == 0:
            t1 = time.perf_counter()
            mon.flush(60)
            scrapes.append(scrape(url, PROJECT, spec.name))
            logged.append(step)
            waited += time.perf_counter() - t1
        if not math.isfinite(losses[-1]) and nonfinite_at is None:
            nonfinite_at = step
        if nonfinite_at is not None and step >= nonfinite_at + 2 * every:
            break  # diverged: a few more logged steps for the alerts, then stop (the truth is already known)
    mon.close("failed" if nonfinite_at is not None else "finished")
    for h in handles:
        h.remove()
    return {
        "spec": config,
        "params": param_count(model),
        "losses": losses,
        "logged_steps": logged,
        "scrapes": scrapes,
        "routed_counts": routed,
        "seconds": time.perf_counter() - t0,
        "seconds_delivering": waited,
    }


def first_by_rule(steps_by_rule: dict[str, list[int]]) -> dict[str, int]:
    return {rule: min(steps) for rule, steps in steps_by_rule.items() if steps}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200, help="optimizer steps per run (default 200)")
    p.add_argument("--every", type=int, default=4, help="log every N steps (default 4)")
    p.add_argument("--seeds", type=int, default=5, help="seeds of each cell's healthy arm (default 5)")
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: the machine is shared)")
    p.add_argument(
        "--seed-offset",
        type=int,
        default=0,
        help="first init seed, also added to the data seed (default 0; another value is a held-out seed set "
        "with another batch order)",
    )
    p.add_argument("--only", default="", help="comma-separated scenarios to run (default all)")
    p.add_argument("--margin", type=float, default=0.1, help="nats worse than the cell's best = went wrong")
    p.add_argument(
        "--load-limit", type=float, default=2.0, help="busiest expert's load over fair share = load went wrong"
    )
    p.add_argument("--out", type=Path, help="write the table and every run as JSON")
    p.add_argument("--workdir", type=Path, help="keep the database, spool and promtool replay here")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    specs = sweep(args.steps, args.seeds, args.seed_offset)
    if args.only:
        keep = set(args.only.split(","))
        specs = [s for s in specs if s.scenario in keep]
    data = stdlib_bytes(2_000_000)
    # the bytes come from this interpreter's standard library: another Python version trains on other data
    fingerprint = hashlib.sha256(data.tobytes()).hexdigest()[:12]
    work = args.workdir or Path(tempfile.mkdtemp(prefix="hyperwatch-ew-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    recorded: dict[str, dict[str, Any]] = {}
    distinct: dict[tuple[Any, ...], RunSpec] = {}
    for spec in specs:
        distinct.setdefault(spec.key(), spec)
    trained = {spec.name: distinct[spec.key()].name for spec in specs}  # cell's run -> the run trained
    with ServiceProcess(f"sqlite:///{work / 'hyperwatch.db'}", log_path=work / "service.log") as svc:
        for i, spec in enumerate(distinct.values()):
            rec = train(
                spec, data, svc.url, args.every, args.seq, args.batch, work / "spool", DATA_SEED + args.seed_offset
            )
            recorded[spec.name] = rec
            print(
                f"[{i + 1}/{len(distinct)}] {spec.name}: {len(rec['losses'])} steps, final loss "
                f"{rec['losses'][-1]:.3f}, {rec['seconds']:.1f} s ({rec['seconds_delivering']:.1f} s delivering)",
                flush=True,
            )
        alerts = service_alerts(svc.url, PROJECT)
    fired = replay({n: r["scrapes"] for n, r in recorded.items()}, RULES, work / "promtool")
    results: list[RunResult] = []
    for spec in specs:
        rec = recorded[trained[spec.name]]
        stored = alerts.get(trained[spec.name], [])
        steps_by: dict[str, dict[str, list[int]]] = {"service": {}, "prometheus": {}}
        for a in stored:
            if a.get("severity") in PAGING:  # an info alert is visible, never a warning nor a false alarm
                steps_by["service"].setdefault(a["rule"], []).append(a["step"])
        for alert, at in fired.get(trained[spec.name], {}).items():
            steps_by["prometheus"][alert] = [rec["logged_steps"][i] for i in at]
        rec["first_by_rule"] = {a: first_by_rule(by) for a, by in steps_by.items()}
        rec["alert_count"] = len(stored)
        first = {a: first_loss_warning(by) for a, by in steps_by.items()}
        onset = spec.onset
        after = {a: first_loss_warning(by, onset) for a, by in steps_by.items()} if onset is not None else {}
        results.append(RunResult(spec.name, spec.scenario, spec.source, spec.steps, rec["losses"], first, onset, after))
    twins: dict[str, list[str]] = {}
    for spec in specs:
        if spec.healthy:
            twins.setdefault(spec.cell, []).append(spec.name)
    truth = ground_truth(results, twins, margin=args.margin)
    rows = score(results, truth, ALERT_SOURCES)
    rows += totals(rows, ALERT_SOURCES)
    elapsed = time.perf_counter() - t0
    print()
    print(
        f"early warning: {len(specs)} runs in {len(distinct)} trained, {elapsed:.0f} s, data sha256 {fingerprint} "
        f"(margin {args.margin} nats; lead frac = first warning / steps, or for a fault injected mid-run the first "
        "warning from its onset / steps left from it; preFA = warned before an injected fault)"
    )
    print(format_table(rows))
    healthy_runs = {trained[r.name] for r in results if not truth[r.name].wrong}
    truth_by_run = {trained[r.name]: truth[r.name] for r in results}
    fa = {
        a: sorted({trained[r.name] for r in results if not truth[r.name].wrong and r.first_warning[a] is not None})
        for a in ALERT_SOURCES
    }
    print(
        f"distinct runs trained: {len(distinct)}; distinct healthy runs: {len(healthy_runs)}; false alarms on them: "
        + ", ".join(f"{a} {len(v)} {[f'{n} ({truth_by_run[n].excess:+.3f})' for n in v]}" for a, v in fa.items())
    )
    clear = args.margin / 2
    print(
        f"  of them on runs clearly healthy (final loss within {clear:g} nats of the twin's; the rest ended "
        f"between {clear:g} and the {args.margin:g} margin): "
        + ", ".join(f"{a} {len(clear_false_alarms(v, truth_by_run, clear))}" for a, v in fa.items())
    )
    load = {n: expert_load_truth(rec["routed_counts"], limit=args.load_limit) for n, rec in recorded.items()
            if rec["routed_counts"]}  # fmt: skip
    vio = {
        n: {a: min((v for k, v in recorded[n]["first_by_rule"][a].items() if k in EFFICIENCY_RULES), default=None)
            for a in ALERT_SOURCES}
        for n in load
    }  # fmt: skip
    eff_rows = score_efficiency(vio, load, {n: recorded[n]["spec"]["steps"] for n in load}, ALERT_SOURCES)
    print()
    print(
        f"efficiency guard (MaxVio rules), judged by expert load: {len(load)} distinct MoE runs; load went wrong = "
        f"over the last 10% of steps the busiest expert got > {args.load_limit:g}x its fair share, or an expert got "
        "no token"
    )
    print(format_efficiency(eff_rows))
    for n, lt in load.items():
        print(
            f"  {n:38s} load {'WRONG' if lt.wrong else 'even '} busiest {lt.busiest_vs_fair:.2f}x fair "
            f"({lt.busiest_share:.1%}), dead experts {lt.dead_experts}, first MaxVio alarm {vio[n]}"
        )
    print()
    for r in results:
        t = truth[r.name]
        rec = recorded[trained[r.name]]
        print(
            f"{r.name:38s} {'WRONG' if t.wrong else 'ok   '} final {t.final:7.3f} dep {t.departure!s:>4} "
            f"svc {rec['first_by_rule']['service']} prom {rec['first_by_rule']['prometheus']} "
            f"({rec['alert_count']} service alerts)"
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        runs_out = {
            n: {k: v for k, v in rec.items() if k != "scrapes"}
            | {"truth": vars(truth[n])}
            | ({"load_truth": vars(load[n])} if n in load else {})
            for n, rec in recorded.items()
        }
        args.out.write_text(
            json.dumps(
                {
                    "rows": rows,
                    "efficiency_rows": eff_rows,
                    "runs": runs_out,
                    "args": vars(args) | {"out": str(args.out), "workdir": str(work), "data_sha256": fingerprint},
                },
                default=str,
                indent=1,
            )
        )
        series_dir = args.out.parent / (args.out.stem + "_series")
        series_dir.mkdir(exist_ok=True)
        for n, rec in recorded.items():
            (series_dir / f"{n}.json").write_text(
                json.dumps(
                    {
                        "run": n,
                        "steps": rec["spec"]["steps"],
                        "logged_steps": rec["logged_steps"],
                        "series": to_columns(rec["scrapes"]),
                    }
                )
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
