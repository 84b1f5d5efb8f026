"""Replaying a run's scraped ``/metrics`` through ``promtool test rules``: when did each rule fire?

The benchmark scrapes the service's ``/metrics`` once per logged step (after the step's batch was
delivered), keeping the run's own ``hyperwatch_run_*`` / ``hyperwatch_layer_*`` gauges. Those
scrapes become a promtool unit test's input series, one *minute* per logged step, so a rule's
``for: 10m`` means 10 logged steps. Every alert of ``prometheus/rules.yml`` is evaluated at every
scrape with no alert expected: promtool lists what actually fired, which is parsed back into
(alert name, logged step). ``hyperwatch_run_last_point_timestamp_seconds`` is left out (wall-clock,
meaningless in the replay: the stale-run rule never fires here).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

Scrape = dict[str, float]  # series text 'name{label="v",...}' -> value
SKIP = ("hyperwatch_run_last_point_timestamp_seconds",)


def parse_scrape(text: str, project: str, run: str) -> Scrape:
    """The run's gauges from one ``/metrics`` exposition, keyed by their series text (labels sorted)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: Scrape = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if not s.name.startswith(("hyperwatch_run_", "hyperwatch_layer_")) or s.name in SKIP:
                continue
            if s.labels.get("project") != project or s.labels.get("run") != run:
                continue
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = float(s.value)
    return out


def fetch(url: str, timeout: float = 30.0) -> bytes:
    """The body of a GET (a benchmark's read of its own service)."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read()  # type: ignore[no-any-return]


def scrape(url: str, project: str, run: str) -> Scrape:
    """The run's gauges from the service's ``/metrics`` now."""
    return parse_scrape(fetch(f"{url}/metrics").decode(), project, run)


def service_alerts(url: str, project: str) -> dict[str, list[dict[str, Any]]]:
    """Every alert the service's own detectors stored for the project, per run name (paged through
    ``GET /api/v1/alerts``; Prometheus' alerts, which reach the service too, left out)."""
    out: dict[str, list[dict[str, Any]]] = {}
    offset = 0
    while True:
        q = urllib.parse.urlencode({"project": project, "limit": 1000, "offset": offset})
        page = json.loads(fetch(f"{url}/api/v1/alerts?{q}"))
        for a in page:
            if a.get("source", "service") == "service":
                out.setdefault(a["run"], []).append(a)
        if len(page) < 1000:
            return out
        offset += len(page)


def to_columns(scrapes: Sequence[Scrape]) -> dict[str, list[float | None]]:
    """The scrapes as one list per series (None where a scrape lacked it): the recorded form on disk."""
    keys = sorted({k for s in scrapes for k in s})
    return {k: [s.get(k) for s in scrapes] for k in keys}


def column_key(columns: dict[str, list[float | None]], gauge: str) -> str:
    """The one recorded series of ``gauge`` (its key, labels included)."""
    (key,) = [k for k in columns if k.startswith(gauge + "{")]
    return key


def add_threshold(columns: dict[str, list[float | None]], beside: str, threshold: str, value: float) -> None:
    """A threshold gauge the service exports now, where a recording predates it: ``value`` at every
    scrape that holds ``beside``'s series, under the same labels (a recorded one is kept)."""
    key = column_key(columns, beside)
    columns.setdefault(threshold + key[len(beside) :], [None if v is None else value for v in columns[key]])


def from_columns(columns: dict[str, list[float | None]]) -> list[Scrape]:
    """:func:`to_columns` undone."""
    n = max((len(v) for v in columns.values()), default=0)
    return [{k: v[i] for k, v in columns.items() if v[i] is not None} for i in range(n)]  # type: ignore[misc]


def at_pace(
    columns: dict[str, list[float | None]], logged_steps: Sequence[int], pace: float
) -> tuple[dict[str, list[float | None]], list[int]]:
    """A recording's scrapes (one per logged step) as Prometheus would take them at ``pace`` scrapes per
    logged step, with the logged step of each: ``pace`` k >= 1, a run that logs every k scrape intervals
    (each scrape repeated k times: the gauges hold their values between logged steps); 1/k, a run that
    logs k times per scrape interval (every k-th scrape kept, the last of each k). Gauges the service
    computes over logged values (the Z baselines, the loss statistics) must be in ``columns`` already:
    they do not change with the pace, the scraped samples do."""
    n = len(logged_steps)
    if pace >= 1:
        k = round(pace)
        if k != pace:
            raise ValueError(f"pace {pace}: a whole number of scrapes per logged step, or 1/k (0.5, 0.25)")
        keep = [i for i in range(n) for _ in range(k)]
    else:
        k = round(1 / pace) if pace > 0 else 0
        if k < 2 or not math.isclose(1 / k, pace):
            raise ValueError(f"pace {pace}: a whole number of scrapes per logged step, or 1/k (0.5, 0.25)")
        keep = list(range(k - 1, n, k))
    paced = {key: [v[i] if i < len(v) else None for i in keep] for key, v in columns.items()}
    return paced, [logged_steps[i] for i in keep]


def _fmt(v: float | None) -> str:
    if v is None:
        return "_"
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Inf" if v > 0 else "-Inf"
    return repr(v)


PAGING = ("warning", "critical")
"""The severities that warn someone: an ``info`` alert is visible but is never a warning nor a false alarm."""


def alert_names(rules: Path, severities: Sequence[str] | None = PAGING) -> list[str]:
    """The alerts of a rules file, those of ``severities`` only (None: all)."""
    doc = yaml.safe_load(rules.read_text())
    return [
        r["alert"]
        for g in doc["groups"]
        for r in g["rules"]
        if "alert" in r and (severities is None or r.get("labels", {}).get("severity") in severities)
    ]


def promtool_test(scrapes: Sequence[Scrape], alerts: Sequence[str]) -> dict[str, Any]:
    """One promtool test: the scrapes as series (one minute apart), every alert checked at every minute."""
    keys = sorted({k for s in scrapes for k in s})
    series = [{"series": k, "values": " ".join(_fmt(s.get(k)) for s in scrapes)} for k in keys]
    checks = [{"eval_time": f"{i}m", "alertname": a, "exp_alerts": []} for i in range(len(scrapes)) for a in alerts]
    return {"interval": "1m", "input_series": series, "alert_rule_test": checks}


_BLOCK = re.compile(r"alertname: (\S+), time: (\S+),(.*?)(?=\n\s*alertname: |\Z)", re.S)
_RUN = re.compile(r'\brun="((?:[^"\\]|\\.)*)"')
_DUR = re.compile(r"(\d+)(ms|h|m|s)")


def minutes(duration: str) -> int:
    """A Prometheus duration as promtool prints it (``1h3m``, ``45m``, ``0s``) in whole minutes."""
    scale = {"h": 60.0, "m": 1.0, "s": 1 / 60, "ms": 1 / 60000}
    total = sum(int(n) * scale[u] for n, u in _DUR.findall(duration))
    return round(total)


def fired(output: str) -> dict[tuple[str, str], list[int]]:
    """(run, alert) -> the minutes it fired at, from promtool's failure report."""
    found: dict[tuple[str, str], list[int]] = {}
    for alert, when, body in _BLOCK.findall(output):
        got = body.split("got:", 1)[1] if "got:" in body else ""
        for run in set(_RUN.findall(got)):
            found.setdefault((run, alert), []).append(minutes(when))
    return found


def replay(
    runs: dict[str, Sequence[Scrape]], rules: Path, workdir: Path, promtool: str | None = None
) -> dict[str, dict[str, list[int]]]:
    """Per run name: per alert name, the indices of the scrapes (logged steps) at which it fired (the
    paging alerts only: warning and critical)."""
    tool = promtool or shutil.which("promtool")
    if tool is None:
        raise RuntimeError("promtool is missing: install it with `bash scripts/system-deps.sh` (Debian 'prometheus')")
    alerts = alert_names(rules)
    workdir.mkdir(parents=True, exist_ok=True)
    shutil.copy(rules, workdir / "rules.yml")
    spec = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [promtool_test(s, alerts) for s in runs.values() if s],
    }
    (workdir / "replay_test.yml").write_text(yaml.safe_dump(spec, sort_keys=False, width=1 << 20))
    r = subprocess.run(
        [tool, "test", "rules", "replay_test.yml"], cwd=workdir, capture_output=True, text=True, timeout=600
    )
    out = r.stdout + r.stderr
    if r.returncode != 0 and "FAILED" not in out:
        raise RuntimeError(f"promtool test rules could not run the replay:\n{out[-4000:]}")
    result: dict[str, dict[str, list[int]]] = {name: {} for name in runs}
    for (run, alert), at in fired(out).items():
        if run in result:
            result[run][alert] = sorted(set(at))
    return result
