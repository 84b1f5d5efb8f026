"""``hyperwatch webhooks add|list|remove|test PROJECT ...``: a project's incident notifications (issue 35).

Through the service's API (``--server``, default ``HYPERWATCH_SERVER`` or ``http://127.0.0.1:8000``)
with the write token (``--token``, default ``HYPERWATCH_WRITE_TOKEN``); the routes are
``/api/v1/projects/{project}/webhooks`` (:mod:`monitor.api.routes.webhooks`). ``list`` shows each
webhook's URL masked, as the API does, with its deliveries and the latest attempt.
"""

from __future__ import annotations

import argparse
import sys
import urllib.parse
from typing import Any

from hyperwatch.monitor.cli.service import Failed as _Failed
from hyperwatch.monitor.cli.service import Service, add_service_flags


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Notify a Slack channel (or any JSON endpoint) of a project's new incidents, retried "
        "until delivered. Alertmanager stays the production path for the Prometheus rules.",
    )
    sub = p.add_subparsers(dest="action", required=True)
    add = sub.add_parser("add", help="add a webhook (or update the project's webhook of this URL)")
    add.add_argument("project")
    add.add_argument("url", help="http:// or https:// URL, e.g. a Slack incoming webhook's")
    add.add_argument("--format", choices=("slack", "generic"), default="slack")
    add.add_argument("--min-severity", choices=("info", "warning", "critical"), default="warning")
    add.add_argument("--name", default="", help="a label, e.g. #training-alerts")
    add.add_argument("--include-prometheus", action="store_true", help="also Alertmanager's incidents")
    lst = sub.add_parser("list", help="a project's webhooks, their deliveries and latest attempt")
    lst.add_argument("project")
    for action, what in (("remove", "remove a webhook and its queued deliveries"), ("test", "send an example now")):
        one = sub.add_parser(action, help=what)
        one.add_argument("project")
        one.add_argument("id", type=int)
    for q in sub.choices.values():
        add_service_flags(q)
    return p


def _call(args: argparse.Namespace, method: str, path: str, body: Any = None) -> Any:
    return Service(args, timeout=60).call(method, path, body)


def _line(hook: dict[str, Any]) -> str:
    last = hook.get("last_delivery")
    latest = "never sent"
    if last:
        latest = f"last {last['state']} at {last['at']} (incident {last['incident_id']}, {last['attempts']} attempts)"
        if last.get("error"):
            latest += f": {last['error']}"
    label = f" {hook['name']}" if hook.get("name") else ""
    return (
        f"{hook['id']}{label} {hook['format']} >= {hook['min_severity']} {hook['url']}: "
        f"{hook['delivered']} delivered, {hook['pending']} pending, {hook['failed']} failed; {latest}"
    )


def act(args: argparse.Namespace) -> str:
    """Do what ``args`` says; the text to print (raises _Failed)."""
    path = f"/api/v1/projects/{urllib.parse.quote(args.project, safe='')}/webhooks"
    if args.action == "add":
        body = {
            "url": args.url,
            "format": args.format,
            "min_severity": args.min_severity,
            "name": args.name,
            "include_prometheus": args.include_prometheus,
        }
        return "saved " + _line(_call(args, "POST", path, body))
    if args.action == "list":
        hooks = _call(args, "GET", path)
        return "\n".join(_line(h) for h in hooks) if hooks else f"project {args.project!r} has no webhooks"
    if args.action == "remove":
        return "removed " + _line(_call(args, "DELETE", f"{path}/{args.id}"))
    got = _call(args, "POST", f"{path}/{args.id}/test")
    if got["delivered"]:
        return f"delivered: the receiver answered HTTP {got['http_status']}"
    raise _Failed(f"not delivered: {got['error']}")


def run(args: argparse.Namespace) -> int:
    try:
        print(act(args))
    except _Failed as exc:
        print(f"hyperwatch webhooks: {exc}", file=sys.stderr)
        return 1
    return 0
