"""``hyperwatch runs delete|archive|unarchive RUN``: remove a run, or hide it and bring it back (issue 35).

``RUN`` is a run id or ``project/name`` (a bare name is in project ``default``). The service's API is
used (``--server``, default ``HYPERWATCH_SERVER`` or ``http://127.0.0.1:8000``) with the write token
(``--token``, default ``HYPERWATCH_WRITE_TOKEN``), or the database itself (``--db``), as
``hyperwatch forecast`` does. ``delete`` asks for the run's name unless ``--yes``: it cannot be undone.
"""

from __future__ import annotations

import argparse
import sys
import urllib.parse
from collections.abc import Callable
from typing import Any

from hyperwatch.monitor.cli.service import Failed as _Failed
from hyperwatch.monitor.cli.service import Service, add_service_flags


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Delete a run with everything it holds, or archive it: hidden from the runs list, group "
        "scale comparisons and alert lists, kept whole, and back with unarchive.",
    )
    p.add_argument("action", choices=("delete", "archive", "unarchive"))
    p.add_argument("run", help="run id, or project/name (a bare name is in project 'default')")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask before deleting")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--db", metavar="URL", help="the database directly: sqlite:///x.db, postgresql+psycopg://")
    add_service_flags(p, source)
    return p


def _target(text: str) -> int | tuple[str, str]:
    if text.isdigit():
        return int(text)
    project, _, name = text.rpartition("/")
    if not name:
        raise _Failed(f"{text!r} is neither a run id nor project/name")
    return project or "default", name


class _Api(Service):
    def find(self, target: int | tuple[str, str]) -> dict[str, Any]:
        if isinstance(target, int):
            found: dict[str, Any] = self.call("GET", f"/api/v1/runs/{target}")
            return found
        project, name = target
        query = urllib.parse.urlencode({"project": project, "include_archived": "true", "limit": 100_000})
        runs = [r for r in self.call("GET", f"/api/v1/runs?{query}") if r["name"] == name]
        if not runs:
            raise _Failed(f"no run {name!r} in project {project!r} at {self.base}")
        return runs[0]

    def delete(self, run_id: int) -> dict[str, Any]:
        deleted: dict[str, Any] = self.call("DELETE", f"/api/v1/runs/{run_id}")
        return deleted

    def archive(self, run_id: int, archived: bool) -> None:
        self.call("PATCH", f"/api/v1/runs/{run_id}", {"archived": archived})


class _Db:
    def __init__(self, url: str) -> None:
        from hyperwatch.monitor.store import SqlStore

        self.store = SqlStore(url)

    def find(self, target: int | tuple[str, str]) -> dict[str, Any]:
        run = self.store.get_run(target) if isinstance(target, int) else self.store.find_run(*target)
        return {"id": run.id, "project": run.project, "name": run.name, "last_step": run.last_step}

    def delete(self, run_id: int) -> dict[str, Any]:
        project, name, series = self.store.delete_run(run_id)
        return {"id": run_id, "project": project, "name": name, "series": series}

    def archive(self, run_id: int, archived: bool) -> None:
        self.store.update_run(run_id, {"archived": archived})


def _confirmed(run: dict[str, Any], ask: Callable[[str], str]) -> bool:
    prompt = (
        f"Delete run {run['project']}/{run['name']} (id {run['id']}) with all its points, alerts and incidents? "
        f"This cannot be undone (archive hides a run instead). Type the run's name to delete it: "
    )
    try:
        return ask(prompt).strip() == run["name"]
    except EOFError:
        return False


def act(args: argparse.Namespace, ask: Callable[[str], str] = input) -> str:
    """Do what ``args`` says; the line to print (raises _Failed)."""
    from hyperwatch.monitor.core.errors import MonitorError

    backend: _Api | _Db = _Db(args.db) if args.db else _Api(args)
    try:
        run = backend.find(_target(args.run))
        what = f"run {run['project']}/{run['name']} (id {run['id']})"
        if args.action == "delete":
            if not args.yes and not _confirmed(run, ask):
                raise _Failed(f"not deleted: the name typed was not {run['name']!r}")
            gone = backend.delete(int(run["id"]))
            return f"deleted {what}: {gone['series']} series"
        backend.archive(int(run["id"]), args.action == "archive")
        return f"{args.action}d {what}"
    except MonitorError as exc:
        raise _Failed(str(exc)) from exc
    finally:
        if isinstance(backend, _Db):
            backend.store.close()


def run(args: argparse.Namespace) -> int:
    try:
        print(act(args))
    except _Failed as exc:
        print(f"hyperwatch runs: {exc}", file=sys.stderr)
        return 1
    return 0
