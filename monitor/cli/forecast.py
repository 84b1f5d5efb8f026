"""``hyperwatch forecast --group NAME --params 7e9``: each indicator of a group forecast at a larger size.

It reads the service's API (``--server``, default ``http://127.0.0.1:8000``) or the database itself
(``--db``), both through :func:`monitor.read.forecasts.group_forecast`, so the table shows the numbers the
API and the scale page's forecast panel give. ``--json`` prints the API's answer as it is.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import urllib.parse
from typing import Any

DEFAULT_SERVER = "http://127.0.0.1:8000"
_SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}


def _size(text: str) -> float:
    """7e9, 7000000000, 1.3B, 300M, 157K: a positive number."""
    m = re.fullmatch(r"\s*([0-9.]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMbBtT]?)\s*", text)
    try:
        value = float(m.group(1)) * _SUFFIX[m.group(2).lower()] if m else 0.0
    except ValueError:  # "1.2.3"
        value = 0.0
    if not 0.0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive size; write 7e9, 1.3B, 300M or 157K")
    return value


def _level(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"{text!r}: the band's probability is a number between 0 and 1, e.g. 0.9")
    return value


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Forecast each stability indicator of a group at a larger model size (or FLOPs): the value "
        "predicted, its prediction band, and the size where it crosses the group's threshold.",
    )
    p.add_argument("--group", required=True, help="the group's name")
    p.add_argument("--project", default="default", help="the group's project (default: default)")
    target = p.add_mutually_exclusive_group()
    target.add_argument("--params", type=_size, help="target model size in parameters: 7e9, 1.3B, 300M")
    target.add_argument("--flops", type=_size, help="target training FLOPs, e.g. 3e21 (fits against FLOPs)")
    p.add_argument("--name", action="append", help="indicator (repeat); default: the seven stability indicators")
    p.add_argument("--agg", choices=("mean", "max"), default="mean", help="over layers, as on the scale page")
    p.add_argument("--level", type=_level, default=0.9, help="the band's probability (default 0.9)")
    p.add_argument("--json", action="store_true", help="print the API's JSON instead of the table")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--server", help=f"service URL (default: HYPERWATCH_SERVER or {DEFAULT_SERVER})")
    source.add_argument("--db", metavar="URL", help="read the database directly: sqlite:///x.db, postgresql+psycopg://")
    p.add_argument("--token", help="read token of the service (default: HYPERWATCH_READ_TOKEN)")
    return p


class _Failed(Exception):
    """What went wrong, in words for the terminal."""


def _query(args: argparse.Namespace) -> dict[str, Any]:
    query: dict[str, Any] = {"agg": args.agg, "level": args.level}
    if args.params is not None:
        query["params"] = args.params
    if args.flops is not None:
        query["flops"] = args.flops
    if args.name:
        query["name"] = args.name
    return query


def _from_server(args: argparse.Namespace) -> dict[str, Any]:
    from hyperwatch.hooks.sinks.client import api, request

    base = args.server or os.environ.get("HYPERWATCH_SERVER") or DEFAULT_SERVER
    token = args.token or os.environ.get("HYPERWATCH_READ_TOKEN")
    groups = request(
        "GET", api(base, "/api/v1/groups?" + urllib.parse.urlencode({"project": args.project})), None, token
    )
    if groups.status != 200:
        raise _Failed(f"{base}: listing the groups failed ({groups.error or groups.status}); is the service up?")
    found = [g for g in groups.body if g["name"] == args.group]
    if not found:
        raise _Failed(f"no group {args.group!r} in project {args.project!r} at {base}; check --group and --project")
    path = f"/api/v1/groups/{found[0]['id']}/forecast?" + urllib.parse.urlencode(_query(args), doseq=True)
    resp = request("GET", api(base, path), None, token, timeout=60)
    if resp.status != 200:
        body_ = resp.body if isinstance(resp.body, dict) else {}
        detail = body_.get("message") or body_.get("detail") or resp.error  # a 422 has both: the words in message
        raise _Failed(f"{base}: {detail or resp.status}")
    body: dict[str, Any] = resp.body
    return body


def _from_db(args: argparse.Namespace) -> dict[str, Any]:
    from hyperwatch.monitor.analysis.forecast import Axis
    from hyperwatch.monitor.core.errors import MonitorError
    from hyperwatch.monitor.read.forecasts import group_forecast
    from hyperwatch.monitor.read.lines import STABILITY_INDICATORS
    from hyperwatch.monitor.store import SqlStore

    store = SqlStore(args.db)
    try:
        found = [g for g in store.list_groups(args.project) if g.name == args.group]
        if not found:
            raise _Failed(f"no group {args.group!r} in project {args.project!r} in {args.db}")
        axis: Axis = "flops" if args.flops is not None else "params"
        names = list(dict.fromkeys(args.name or STABILITY_INDICATORS))
        target = args.flops or args.params
        return group_forecast(store, found[0].id, names, axis, target, args.agg, args.level).to_json()
    except MonitorError as exc:
        raise _Failed(str(exc)) from exc
    finally:
        store.close()


def _num(v: Any) -> str:
    from hyperwatch.monitor.analysis.forecast import fmt_value

    return "" if v is None else (v if isinstance(v, str) else fmt_value(float(v)))


def _predicted(peak: dict[str, Any]) -> str:
    """The table's "predicted" cell: the value, or "no reliable" where the band spans more than
    ``forecasts.UNRELIABLE_RATIO`` (the sentence below the table gives the band)."""
    return _num(peak["predicted"]) if peak.get("reliable", True) else "no reliable"


def table(body: dict[str, Any]) -> str:
    """The forecast as a table (one row per indicator, its peak) and the sentences below it."""
    from hyperwatch.monitor.analysis.forecast import fmt_size

    axis = body["axis"]
    target = body["target"]
    matched = body["matched"]
    at = "" if target is None else f" at {fmt_size(target, axis)} {'params' if axis == 'params' else 'FLOPs'}"
    compared = f"runs compared at {matched['fraction'] or 0:.0%} of training"
    if matched["reason"]:
        compared += f" ({matched['reason']})"
    group = f"{body['project']}/{body['group']}"
    lines = [f"group {group}: forecast{at}, {body['level']:.0%} band, {body['agg']} over layers, {compared}"]
    header = ("indicator", "sizes", "exponent", "predicted", "band", "threshold", "crosses at")
    rows = [header]
    sentences = []
    for name, ind in body["indicators"].items():
        peak = ind["peak"]
        fit = peak["fit"] or {}
        band = f"{_num(peak['lower'])}-{_num(peak['upper'])}" if peak["lower"] is not None else ""
        cross = peak["crossing"] or {}
        where = {"crosses": fmt_size(cross["size"], axis) if cross.get("size") else "", "above": "below the smallest",
                 "never": "not within 1000x"}.get(cross.get("status", ""), "")  # fmt: skip
        rows.append((name, str(fit.get("n_sizes", sum(p["used"] for p in peak["points"]))),
                     "" if not fit else f"{fit['exponent']:.3g}", _predicted(peak), band,
                     _num(ind["threshold"]), where))  # fmt: skip
        sentences.append(peak["sentence"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines += ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines += ["", *sentences]
    for w in body["watched"]:
        lines += [f"{w['run']} (training): {ind['sentence']}" for ind in w["indicators"].values()]
    if body["skipped"]:
        lines.append("skipped: " + "; ".join(f"{s['run']}: {s['reason']}" for s in body["skipped"]))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        body = _from_db(args) if args.db else _from_server(args)
    except _Failed as exc:
        print(f"hyperwatch forecast: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(body, indent=2, allow_nan=False) if args.json else table(body))
    return 0
