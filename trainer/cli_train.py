"""``hyperwatch train [--config F] [--key value ...]``: one run of the bundled trainer.

Overrides are ``--section.key value`` (``--model.depth 4``) or ``--key value`` when the key is
unique across sections (``--depth 4``); ``--preset tiny`` starts from the CPU-sized family.
Under torchrun every rank runs this same command.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from hyperwatch.trainer.config import ARMS, PRESETS, SECTIONS, ConfigError, load_config


def build_parser(prog: str) -> argparse.ArgumentParser:
    sections = ", ".join(f"[{name}]" for name in SECTIONS)
    p = argparse.ArgumentParser(
        prog=prog,
        description="Train one model. Options: --config FILE.toml, then any --section.key value overrides "
        f"of its {sections} tables (--key value when only one section has the key, e.g. --depth 4).",
        epilog="example: hyperwatch train --preset tiny --arm hyperp_moe --depth 2 --log.sink runs/offline",
    )
    p.add_argument("--config", default=None, help="TOML file with " + " ".join(SECTIONS_TABLES) + " tables")
    p.add_argument("--print-config", action="store_true", help="print the resolved config as JSON and exit")
    common = p.add_argument_group("common settings (shortcuts for --section.key value)")
    common.add_argument(
        "--preset", metavar="NAME", help=f"a model family: {', '.join(PRESETS)} (default paper; tiny trains on a CPU)"
    )
    common.add_argument("--arm", metavar="NAME", help=f"the optimizer arm (--optim.arm): {', '.join(ARMS)}")
    common.add_argument("--depth", metavar="N", help="number of blocks (--model.depth)")
    common.add_argument("--log.sink", metavar="URL|DIR", help="stream to the service at URL, or JSONL into DIR")
    return p


SECTIONS_TABLES = [f"[{name}]" for name in SECTIONS]
SHORTCUTS = ("preset", "arm", "depth", "log.sink")
"""Options listed in --help; parsed as the overrides they are (the config decides their values)."""


def parse_args(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    args, rest = parser.parse_known_args(argv)
    given = [(key, getattr(args, key)) for key in SHORTCUTS if getattr(args, key, None) is not None]
    args.overrides = [item for key, value in given for item in (f"--{key}", value)] + rest
    return args


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_config(args.config, args.overrides)
    except (ConfigError, ValueError) as exc:
        print(f"hyperwatch train: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(json.dumps(cfg.to_dict(), indent=2))
        return 0
    from hyperwatch.trainer.train import Trainer

    try:
        trainer = Trainer(cfg)
    except (ConfigError, ValueError) as exc:
        print(f"hyperwatch train: {exc}", file=sys.stderr)
        return 2
    result = trainer.fit()
    is_main = trainer.is_main
    trainer.close()  # every rank leaves the process group cleanly (torchrun: DDP or FSDP)
    if is_main:
        summary = {
            "run": result.run,
            "steps": result.steps,
            "tokens": result.tokens,
            "final_loss": result.losses[-1][1] if result.losses else None,
            "final_val_loss": result.final_val_loss,
            "tokens_per_second": round(result.tokens_per_second, 1),
            "attention_kernel": result.attention_kernel,
            "params": result.size.total_params,
            "active_params": result.size.active_params,
            "training_flops": result.size.training_flops,
        }
        print(json.dumps(summary, indent=2))
    return 0
