"""The ``hyperwatch`` command: a thin dispatcher over the components' own commands.

Each subcommand lives with the component that owns it and is imported lazily, so
``hyperwatch size`` never imports FastAPI and ``hyperwatch serve`` never imports the trainer.
A command module exposes ``build_parser(prog: str) -> argparse.ArgumentParser`` and
``run(args: argparse.Namespace) -> int``, and optionally ``parse_args(parser, argv)``.
"""

from __future__ import annotations

import importlib
import importlib.util
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
    "fit": ("hyperwatch.monitor.cli.analysis", "scaling analysis: optimal LR, power laws, scaling laws, sensitivity"),
    "forecast": (
        "hyperwatch.monitor.cli.forecast",
        "each indicator of a group forecast at a larger size, with its band and threshold crossing",
    ),
    "serve": ("hyperwatch.serve", "run the monitoring service"),
    "db": ("hyperwatch.monitor.cli.db", "database schema commands (upgrade, downgrade, current)"),
    "runs": ("hyperwatch.monitor.cli.runs", "delete a run, or archive / unarchive it (hidden from lists, kept)"),
    "webhooks": ("hyperwatch.monitor.cli.webhooks", "notify Slack or a JSON endpoint of a project's new incidents"),
    "upload": ("hyperwatch.hooks.upload", "replay an offline JSONL folder or an HTTP spool into the service"),
}


EXTRAS: dict[str, tuple[str, ...]] = {
    "server": (
        "fastapi",
        "uvicorn",
        "pydantic",
        "pydantic_settings",
        "sqlalchemy",
        "alembic",
        "psycopg",
        "plotly",
        "prometheus_client",
        "fastapi_offline",
        "msgspec",
        "scipy",
    ),
    "trainer": ("tokenizers", "tqdm"),
}
"""The importable modules of each extra in pyproject.toml (``pip install 'hyperwatch[server]'``)."""

NEEDS: dict[str, str] = {
    "train": "trainer",
    "data": "trainer",
    "sweep": "all",
    "demo": "all",
    "fit": "server",
    "forecast": "server",
    "serve": "server",
    "db": "server",
    "runs": "server",
}
"""The extra each command needs beyond the hooks (torch and numpy); ``size`` and ``upload`` need none."""


def _modules(extra: str) -> tuple[str, ...]:
    return EXTRAS["server"] + EXTRAS["trainer"] if extra == "all" else EXTRAS[extra]


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _install_hint(name: str, extra: str, missing: Sequence[str]) -> str:
    what = {"server": "the service's packages", "trainer": "the trainer's packages"}.get(
        extra, "the service's and trainer's packages"
    )
    return (
        f"hyperwatch {name}: needs {what}, and {', '.join(missing)} cannot be imported here (a hooks-only "
        f"install). Install the extra:\n    pip install 'hyperwatch[{extra}]'\n"
        f"(from a source checkout: pip install -e '.[{extra}]'; from a built wheel: "
        f"pip install 'dist/hyperwatch-VERSION-py3-none-any.whl[{extra}]')"
    )


def missing_extra(name: str) -> str | None:
    """The message for a command whose extra is not installed, else None (checked before it runs,
    so a command in a hooks-only install writes nothing and prints no traceback)."""
    extra = NEEDS.get(name)
    if extra is None:
        return None
    missing = [m for m in _modules(extra) if not _importable(m)]
    return _install_hint(name, extra, missing) if missing else None


def _extra_of(module: str | None) -> str | None:
    top = (module or "").split(".")[0]
    return next((extra for extra, mods in EXTRAS.items() if top in mods), None)


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
    wants_help = any(a in ("-h", "--help") for a in args[1:])
    problem = None if wants_help else missing_extra(name)
    if problem is not None:
        print(problem, file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(COMMANDS[name][0])
        parser = module.build_parser(f"hyperwatch {name}")
        # A command that takes free-form options (``train --model.depth 4``) parses them itself.
        parse = getattr(module, "parse_args", None)
        parsed = parse(parser, args[1:]) if parse is not None else parser.parse_args(args[1:])
        return int(module.run(parsed) or 0)
    except ModuleNotFoundError as exc:
        extra = _extra_of(exc.name)
        if extra is None:
            raise
        print(_install_hint(name, extra, [exc.name or "?"]), file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
