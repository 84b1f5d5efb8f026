/* Runs page: filters (project, group, tags, status, depth, params, archived), sortable columns, live
   status (refreshed every 10 s while "live" is ticked), alert badges, links to groups; the extra
   columns (config keys, loss summaries), their picker and the filter expression: runs_columns.js.
   The columns, filter, sort and archived toggle live in the URL (the columns in localStorage too). */
"use strict";

(() => {
  const form = document.getElementById("filters");
  const tbody = document.querySelector("#runs-table tbody");
  let runs = [];
  let alertCounts = {};
  let sortKey = "updated_at";
  let sortDir = -1;
  let timer = null;
  let shownIds = [];
  const picked = new Set();
  let chosen = { ids: [], explicit: false };
  let clauses = [];
  let extras = new Map();  // run id -> {config: flattened config, alerts, updated}

  /* The compare links: the ticked runs, and every run the filters show. */
  function compareLinks() {
    const sel = document.getElementById("compare-selected");
    const ids = Array.from(picked);
    sel.textContent = `Compare selected (${ids.length})`;
    sel.setAttribute("href", "/compare?" + ids.map((id) => `run_id=${id}`).join("&"));
    sel.setAttribute("aria-disabled", ids.length ? "false" : "true");
    document.getElementById("compare-shown").setAttribute("href",
      "/compare?" + shownIds.slice(0, 50).map((id) => `run_id=${id}`).join("&"));
    document.getElementById("pick-all").checked = shownIds.length > 0 && shownIds.every((id) => picked.has(id));
  }

  function filters() {
    const f = new FormData(form);
    return {
      project: f.get("project").trim(), group: f.get("group").trim(), status: f.get("status"),
      tag: f.get("tags").split(/\s+/).filter(Boolean),
      minDepth: f.get("min_depth") ? Number(f.get("min_depth")) : null,
      maxDepth: f.get("max_depth") ? Number(f.get("max_depth")) : null,
      minParams: HW.parseCount(f.get("min_params")),
      live: f.get("live") === "on",
      archived: f.get("archived") === "on",
    };
  }

  const cellFor = (r) => (id) => HWRuns.cellOf(r, id, extras.get(r.id));

  /* The extra columns shown: the choice; the default summaries only where some listed run has them. */
  function columns() {
    if (chosen.explicit) return chosen.ids;
    return chosen.ids.filter((id) => runs.some((r) => HWRuns.cellOf(r, id, extras.get(r.id)).kind !== "missing"));
  }

  function header(cols) {
    const anchor = document.getElementById("th-alerts");
    document.querySelectorAll("#runs-table th.extra").forEach((th) => th.remove());
    for (const id of cols) {
      /* a break allowed after each dot of a long config key, never inside a word */
      const parts = HWRuns.label(id).split(".").flatMap((p, i) => (i ? [".", HW.el("wbr"), p] : [p]));
      anchor.before(HW.el("th", { "data-key": id, class: "extra", title: id }, ...parts));
    }
    document.querySelectorAll("#runs-table th[data-key]").forEach((th) => {
      if (th.dataset.key === sortKey) th.setAttribute("aria-sort", sortDir > 0 ? "ascending" : "descending");
      else th.removeAttribute("aria-sort");
    });
  }

  function extraCells(r, cols) {
    return cols.map((id) => {
      const c = HWRuns.cellOf(r, id, extras.get(r.id));
      const cls = [c.kind === "text" ? "cfg" : "num", c.kind].join(" ");
      return HW.el("td", { class: cls, "data-col": id, title: c.full || c.text, text: c.text });
    });
  }

  function render() {
    const f = filters();
    const cols = columns();
    header(cols);
    const shown = runs.filter((r) => (f.minDepth === null || (r.depth || 0) >= f.minDepth)
      && (f.maxDepth === null || (r.depth !== null && r.depth <= f.maxDepth))
      && (f.minParams === null || (r.total_params || 0) >= f.minParams)
      && HWRuns.passes(cellFor(r), clauses));
    shown.sort((a, b) => HWRuns.compare(cellFor(a)(sortKey), cellFor(b)(sortKey), sortDir));
    shownIds = shown.map((r) => r.id);
    tbody.replaceChildren(...shown.map((r) => {
      const n = alertCounts[r.id] || 0;
      return HW.el("tr", { "data-run-id": r.id, class: r.archived ? "archived" : null },
        HW.el("td", {}, HW.el("a", { href: `/runs/${r.id}`, class: "run-name", text: r.name }),
          r.archived ? HW.el("span", { class: "badge archived", title: "archived: hidden unless shown", text: "archived" }) : ""),
        HW.el("td", { text: r.project }),
        HW.el("td", {}, r.group_id ? HW.el("a", { href: `/groups/${r.group_id}`, text: r.group }) : ""),
        HW.el("td", {}, r.stale
          ? HW.el("span", { class: "badge status-stale", title: `marked ${r.status}, but no points lately`, text: "stale" })
          : HW.el("span", { class: `badge status-${r.status}`, text: r.status })),
        HW.el("td", { class: "num", text: r.depth ?? "" }),
        HW.el("td", { class: "num", text: HW.fmtCount(r.total_params) }),
        HW.el("td", { class: "num", title: r.tokens ? `of ${HW.fmtCount(r.tokens)}` : "",
          text: HW.fmtCount(r.tokens_seen ?? (r.status === "finished" ? r.tokens : null)) }),
        HW.el("td", { class: "num", text: r.last_step ?? "" }),
        ...extraCells(r, cols),
        HW.el("td", {}, n ? HW.el("a", { href: `/alerts?run_id=${r.id}`, class: "badge alert", text: String(n) }) : ""),
        HW.el("td", { class: "tags" }, ...(r.tags || []).map((t) => HW.el("span", { class: "tag", text: t }))),
        HW.el("td", { text: (latest(r) || "").replace("T", " ").slice(0, 19) }),
        HW.el("td", {}, HW.el("input", { type: "checkbox", class: "pick", "aria-label": `compare ${r.name}`,
          checked: picked.has(r.id), onchange: (ev) => {
            if (ev.target.checked) picked.add(r.id); else picked.delete(r.id);
            compareLinks();
          } })));
    }));
    compareLinks();
    HW.status(`${shown.length} of ${runs.length} runs`);
  }

  /* "Updated": the newest of the run's last point and its last change (points do not touch updated_at). */
  function latest(r) {
    return [r.last_point_at, r.updated_at].filter(Boolean).sort().pop();
  }

  async function load() {
    const f = filters();
    const [found, alerts] = await Promise.all([
      HW.api("/api/v1/runs", { project: f.project, group: f.group, status: f.status, tag: f.tag, limit: 1000,
        summary: HWRuns.SUMMARY_NAMES.join(","), include_archived: f.archived ? "true" : null }),
      HW.api("/api/v1/alerts", { project: f.project, limit: 1000 }),
    ]);
    runs = found;
    alertCounts = {};
    for (const a of alerts) alertCounts[a.run_id] = (alertCounts[a.run_id] || 0) + 1;
    extras = new Map(runs.map((r) => [r.id, { config: HWRuns.flatten(r.config), alerts: alertCounts[r.id] || 0,
      updated: latest(r) }]));
    picker();
    applyFilter();
    render();
  }

  /* The picker: every summary column, and each config key present among the listed runs (plus any chosen). */
  function picker() {
    const keys = new Set();
    for (const e of extras.values()) Object.keys(e.config).forEach((k) => keys.add(k));
    chosen.ids.filter((id) => id.startsWith("config.")).forEach((id) => keys.add(id.slice(7)));
    const underscoreLast = (a, b) => (a.startsWith("_") - b.startsWith("_")) || (a < b ? -1 : a > b ? 1 : 0);
    const shown = new Set(columns());
    const box = (id, text) => HW.el("label", { class: "inline" },
      HW.el("input", { type: "checkbox", "data-col": id, checked: shown.has(id), onchange: choose }), text);
    document.getElementById("columns-summary").replaceChildren(...HWRuns.SUMMARY.map((c) => box(c.id, c.label)));
    document.getElementById("columns-config").replaceChildren(
      ...[...keys].sort(underscoreLast).map((k) => box("config." + k, k)));
  }

  function choose() {
    const ticked = Array.from(document.querySelectorAll("#columns-picker input[data-col]:checked"));
    chosen = { ids: ticked.map((i) => i.dataset.col), explicit: true };
    HWRuns.remember(chosen.ids);
    saveState();
    render();
  }

  /* The filter expression, validated against the listed runs' keys; a wrong one filters nothing and says why. */
  function applyFilter() {
    const input = document.getElementById("run-filter");
    const error = document.getElementById("filter-error");
    const keys = new Set();
    for (const e of extras.values()) Object.keys(e.config).forEach((k) => keys.add(k));
    try {
      clauses = HWRuns.parseFilter(input.value, keys);
      error.textContent = "";
      input.removeAttribute("aria-invalid");
    } catch (e) {
      clauses = [];
      error.textContent = "Filter not applied: " + e.message;
      input.setAttribute("aria-invalid", "true");
    }
  }

  function saveState() {
    HWRuns.writeUrl({ col: chosen.explicit ? chosen.ids : null, q: document.getElementById("run-filter").value.trim(),
      archived: filters().archived, sort: sortKey, desc: sortDir < 0 });
  }

  async function groups() {
    const gs = await HW.api("/api/v1/groups");
    document.getElementById("groups-list").replaceChildren(...gs.map((g) => HW.el("li", {},
      HW.el("a", { href: `/groups/${g.id}`, text: `${g.project}/${g.name}` }), " · ",
      HW.el("a", { href: `/groups/${g.id}/sweeps`, text: "sweeps" }))));
  }

  function schedule() {
    clearInterval(timer);
    if (filters().live) timer = setInterval(() => load().catch(HW.fail), 10000);
  }

  document.addEventListener("DOMContentLoaded", () => {
    const q = new URLSearchParams(location.search);
    for (const k of ["project", "group", "tags", "status"]) if (q.get(k)) form.elements[k].value = q.get(k);
    form.elements.archived.checked = q.get("archived") === "1";
    document.getElementById("run-filter").value = q.get("q") || "";
    if (q.get("sort")) { sortKey = q.get("sort"); sortDir = q.get("desc") === "1" ? -1 : 1; }
    chosen = HWRuns.initialChoice(q);
    document.querySelector("#runs-table thead").addEventListener("click", (ev) => {
      const th = ev.target.closest("th[data-key]");
      if (!th) return;
      const key = th.dataset.key;
      sortDir = key === sortKey ? -sortDir : 1;
      sortKey = key;
      saveState();
      render();
    });
    for (const kind of ["input", "change"]) {
      document.getElementById("run-filter").addEventListener(kind, () => { applyFilter(); saveState(); render(); });
    }
    form.addEventListener("submit", (ev) => { ev.preventDefault(); load().catch(HW.fail); schedule(); });
    form.elements.live.addEventListener("change", schedule);
    form.elements.archived.addEventListener("change", () => { saveState(); load().catch(HW.fail); });
    document.getElementById("pick-all").addEventListener("change", (ev) => {
      for (const id of shownIds) { if (ev.target.checked) picked.add(id); else picked.delete(id); }
      render();
    });
    HW.begin();
    Promise.all([load(), groups()]).catch(HW.fail).finally(HW.end);
    schedule();
  });
})();
