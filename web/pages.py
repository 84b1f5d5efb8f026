"""HTML shells of the pages. They hold no data and no user string: the page's script fetches JSON
(``/api/v1`` and ``/ui/data``) and writes user strings with ``textContent`` only, so escaping
cannot be forgotten in a template. Ids in the path are integers, validated by the router."""

from __future__ import annotations

from html import escape
from typing import get_args

from hyperwatch.monitor.api.schemas import Status

NAV = (("Runs", "/runs"), ("Compare", "/compare"), ("Alerts", "/alerts"))


def _shell(
    title: str, script: str, body: str, assets: dict[str, str], data: dict[str, str] | None = None, extra: str = ""
) -> str:
    attrs = "".join(f' data-{k}="{escape(v)}"' for k, v in (data or {}).items())
    more = "".join(f'\n<script src="{assets[e]}" defer></script>' for e in extra.split())
    nav = "".join(f'<a href="{href}">{name}</a>' for name, href in NAV)
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)} · HyperWatch</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="{assets["style.css"]}">
<script src="{assets["plotly"]}" defer></script>
<script src="{assets["common.js"]}" defer></script>
<script src="{assets[script]}" defer></script>{more}
</head>
<body>
<header><a class="brand" href="/runs">HyperWatch</a><nav>{nav}</nav>
<form id="token-form" hidden><label>Read token <input id="token-input" type="password" autocomplete="off"></label>
<button type="submit">Use</button></form></header>
<main id="page"{attrs}>
<p id="status" class="status" role="status"></p>
{body}
</main>
</body>
</html>
"""


STATUS_OPTIONS = "".join(f"<option>{s}</option>" for s in get_args(Status))
"""The one list of run statuses (hooks' wire schema), so the filter offers every status a run can have."""


def runs_page(assets: dict[str, str]) -> str:
    body = (
        """<h1>Runs</h1>
<form id="filters" class="filters">
<label>Project <input name="project" autocomplete="off"></label>
<label>Group <input name="group" autocomplete="off"></label>
<label>Tags <input name="tags" placeholder="tag1 tag2" autocomplete="off"></label>
<label>Status <select name="status"><option value="">any</option>"""
        + STATUS_OPTIONS
        + """</select></label>
<label>Depth ≥ <input name="min_depth" type="number" min="1" step="1"></label>
<label>Depth ≤ <input name="max_depth" type="number" min="1" step="1"></label>
<label>Params ≥ <input name="min_params" placeholder="e.g. 100M" autocomplete="off"></label>
<button type="submit">Filter</button>
<label class="inline"><input type="checkbox" name="live" checked> live</label>
<label class="inline"><input type="checkbox" name="archived"> show archived</label>
</form>
"""
        + RUN_COLUMNS
        + """
<p class="controls">
<a id="compare-selected" class="button" href="/compare" aria-disabled="true">Compare selected (0)</a>
<a id="compare-shown" href="/compare">Compare all shown</a></p>
<div class="table-wrap"><table id="runs-table" class="grid"><thead><tr>
<th data-key="name">Run</th><th data-key="project">Project</th><th data-key="group">Group</th>
<th data-key="status">Status</th><th data-key="depth">Depth</th><th data-key="total_params">Params</th>
<th data-key="tokens">Tokens</th><th data-key="last_step">Last step</th><th data-key="alerts" id="th-alerts">Alerts</th>
<th data-key="tags">Tags</th><th data-key="updated_at">Updated</th>
<th><label class="inline"><input type="checkbox" id="pick-all"> compare</label></th></tr></thead><tbody></tbody>
</table></div>
<h2>Groups</h2><ul id="groups-list" class="links"></ul>"""
    )
    return _shell("Runs", "runs.js", body, assets, extra="runs_columns.js")


RUN_COLUMNS = """<details id="columns-picker"><summary>Columns</summary>
<div class="columns-list" id="columns-summary" aria-label="summary columns"></div>
<div class="columns-list" id="columns-config" aria-label="config columns"></div></details>
<div class="controls filter-row"><label class="grow">Filter rows
<input id="run-filter" autocomplete="off" spellcheck="false" placeholder="e.g. lr>1e-3, optim.arm=hyperp, loss.min<2.5"
 aria-describedby="filter-error"></label></div>
<p id="filter-error" class="status error filter-error" role="alert"></p>"""
"""The runs table's column picker (config keys, loss summaries) and its filter expression (static/runs_columns.js)."""


def run_page(assets: dict[str, str], run_id: int) -> str:
    body = """<h1 id="run-title">Run</h1>
<div id="run-meta" class="meta"></div>
<details id="environment" open hidden><summary>Environment</summary><table id="env-table" class="grid kv"></table>
</details>
<details id="unavailable" class="notice" hidden><summary></summary><ul></ul></details>
<div class="controls">
<label>x-axis <select id="x-axis"><option value="step">step</option>
<option value="tokens">tokens</option></select></label>
<label class="inline"><input type="checkbox" id="log-y"> log y</label>
<label class="inline"><input type="checkbox" id="ema"> EMA smoothing</label>
</div>
<section id="forecast-watch" hidden></section>
<div id="figures"></div>
<details id="config-box"><summary>Config</summary><table id="config" class="grid kv"></table></details>"""
    body += RUN_ACTIONS
    return _shell("Run", "run.js", body, assets, {"run-id": str(run_id)}, extra="forecast.js run_actions.js")


RUN_ACTIONS = """
<p id="run-actions" class="controls" hidden><span id="run-archived-note" class="badge" hidden>archived</span>
<button type="button" id="run-archive">Archive</button> <button type="button" id="run-delete">Delete</button></p>
<dialog id="run-action-dialog"><form method="dialog"><p id="run-action-text"></p>
<label>Run name <input id="run-action-name" autocomplete="off"></label>
<label>Write token <input id="run-action-token" type="password" autocomplete="off"></label>
<p id="run-action-error" class="status error" role="alert"></p>
<button type="submit" id="run-action-confirm" value="confirm">Confirm</button>
<button type="submit" value="cancel" formnovalidate>Cancel</button></form></dialog>"""
"""Archive / Delete with a confirmation dialog (static/run_actions.js; issue 35)."""


def compare_page(assets: dict[str, str]) -> str:
    """Any runs on one chart; the state (runs, indicator, layer, x-axis, toggles) lives in the query string."""
    body = """<h1 id="compare-title">Compare runs</h1>
<div class="controls">
<label>indicator <select id="name"></select></label>
<label>layers <select id="layer"><option value="mean">mean over layers</option>
<option value="max">max over layers</option></select></label>
<label>x-axis <select id="x-axis"><option value="step">step</option><option value="tokens">tokens</option>
<option value="flops">FLOPs</option><option value="fraction">fraction of training</option></select></label>
<label class="inline"><input type="checkbox" id="log-y"> log y</label>
<label class="inline"><input type="checkbox" id="ema"> EMA smoothing</label>
<a id="share" href="#">link to this view</a>
</div>
<div id="legend" class="legend" aria-label="runs: click to hide or show"></div>
<p id="missing" class="missing"></p>
<div id="rows"><div class="fig line" id="fig-compare"></div></div>
<p class="sub">Pick runs on <a href="/runs">Runs</a> (tick them, then "Compare selected"), or add
<code>?project=…&amp;group=…&amp;tag=…</code> to compare every run a filter finds.</p>"""
    return _shell("Compare runs", "compare.js", body, assets)


def group_page(assets: dict[str, str], group_id: int) -> str:
    body = """<h1 id="group-title">Scale comparison</h1>
<p class="sub"><a id="sweeps-link" href="#">Sweeps and scaling laws →</a></p>
<div class="controls">
<label>x-axis <select id="x-axis"><option value="step">step</option><option value="tokens">tokens</option>
<option value="flops">FLOPs</option><option value="fraction">fraction of training</option></select></label>
<label>layers <select id="agg"><option value="mean">mean over layers</option>
<option value="max">max over layers</option></select></label>
<label class="inline"><input type="checkbox" id="log-y"> log y</label>
<label class="inline"><input type="checkbox" id="ema"> EMA smoothing</label>
</div>
<div id="legend" class="legend" aria-label="runs: click to hide or show"></div>
<section id="forecast-panel"></section>
<div id="rows"></div>
<h2>Runs in this group</h2><ul id="group-runs" class="links"></ul>
<h2>Thresholds</h2>
<p id="thresholds-note" class="sub"></p>
<table id="thresholds-table" class="grid"><thead><tr><th>Threshold</th><th>Value</th><th>Source</th><th>Default</th>
<th>Where it came from</th></tr></thead><tbody></tbody></table>"""
    return _shell("Scale comparison", "group.js", body, assets, {"group-id": str(group_id)}, extra="forecast.js")


def sweeps_page(assets: dict[str, str], group_id: int) -> str:
    body = """<h1 id="group-title">Sweeps</h1>
<p class="sub"><a id="compare-link" href="#">← Scale comparison</a></p>
<div class="controls"><label>baseline <select id="baseline"><option value="">none</option></select></label></div>
<ul id="notes" class="notes"></ul>
<div id="figures" class="two"></div>"""
    return _shell("Sweeps", "sweeps.js", body, assets, {"group-id": str(group_id)})


def alerts_page(assets: dict[str, str]) -> str:
    body = """<h1>Alerts</h1>
<form id="filters" class="filters">
<label>Run id <input name="run_id" type="number" min="1" step="1"></label>
<label>Kind <select name="rule"><option value="">any</option><option>logit_ceiling</option><option>z_growth</option>
<option>z_spike</option><option>loss_spike</option><option>grad_norm_spike</option><option>nan_loss</option>
<option>nonfinite_value</option><option>max_vio_collapse</option><option>forecast_band</option></select></label>
<label>Project <input name="project" autocomplete="off"></label>
<button type="submit">Filter</button></form>
<div id="timeline" class="fig"></div>
<h2>Incidents</h2>
<p class="sub">One row per run, kind and episode; ▸ shows its layers, heads, steps and the usual remedies.
Run peak: the largest value of the indicator over the whole run; worst event: the largest among the incident's
alert events.</p>
<table id="alerts-table" class="grid"><thead><tr><th>Last active</th><th>Run</th><th>Kind</th><th>Source</th>
<th>Severity</th><th>Indicator</th><th>Steps</th>
<th title="the largest value the indicator's series reached over the whole run (every layer and step)">Run peak</th>
<th title="the worst value among this incident's alert events (NaN counts as the worst)">Worst event</th>
<th>Events</th><th>Message</th></tr></thead>
<tbody></tbody></table>"""
    return _shell("Alerts", "alerts.js", body, assets)
