"""The ``hyperwatch`` command: a thin dispatcher over the components' own commands.

Each subcommand lives with the component that owns it and is imported lazily, so
``hyperwatch size`` never imports FastAPI and ``hyperwatch serve`` never imports the trainer.
A command module exposes ``build_parser(prog: str) -> argparse.ArgumentParser`` and
``run(args: argparse.Namespace) -> int``, and optionally ``parse_args(parser, argv)``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

# name -> (module, one-line help). Order is the order shown in --help.
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("hyperwatch.trainer.cli_train", "train one model (TOML config plus --key value overrides)"),
    "size": ("hyperwatch.trainer.sizes", "parameters, tokens and FLOPs of a model size, without allocating it"),
    "data": (
        "hyperwatch.trainer.data.cli",
        "prepare token shards (train a BPE tokenizer locally, write uint16 shards)",
    ),
    "sweep": (
        "hyperwatch.trainer.sweep",
        "a grid of runs across depth, LR, tokens, arm, S and k, streaming into the service",
    ),
    "demo": ("hyperwatch.trainer.demo", "the main job: a small cross-scale sweep, streamed and summarised"),
    "fit": ("hyperwatch.monitor.analysis.cli", "scaling analysis: optimal LR, power laws, scaling laws, sensitivity"),
    "forecast": (
        "hyperwatch.monitor.forecast_cli",
        "each indicator of a group forecast at a larger size, with its band and threshold crossing",
    ),
    "serve": ("hyperwatch.serve", "run the monitoring service"),
    "db": ("hyperwatch.monitor.db_cli", "database schema commands (upgrade, current)"),
    "upload": ("hyperwatch.hooks.upload", "replay an offline JSONL folder or an HTTP spool into the service"),
}


def _usage() -> str:
    width = max(len(n) for n in COMMANDS)
    lines = ["usage: hyperwatch COMMAND [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Run 'hyperwatch COMMAND --help' for a command's options."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if args[0] in ("-V", "--version"):
        from hyperwatch import __version__

        print(f"hyperwatch {__version__}")
        return 0
    name = args[0]
    if name not in COMMANDS:
        print(f"hyperwatch: unknown command {name!r}; choose one of: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    parser = module.build_parser(f"hyperwatch {name}")
    # A command that takes free-form options (``train --model.depth 4``) parses them itself.
    parse = getattr(module, "parse_args", None)
    parsed = parse(parser, args[1:]) if parse is not None else parser.parse_args(args[1:])
    return int(module.run(parsed) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
