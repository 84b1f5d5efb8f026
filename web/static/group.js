/* Scale comparison: one row per indicator: every run's line (coloured by size) | peak & final vs size. */
"use strict";

(() => {
  const groupId = HW.pageData("groupId");
  const INDICATORS = ["attention_z", "router_z", "attention_rms", "mlp_rms", "attention_outlier_ratio",
    "mlp_outlier_ratio", "max_vio", "loss"];
  const rows = document.getElementById("rows");
  const xSel = document.getElementById("x-axis");
  const aggSel = document.getElementById("agg");
  const controls = HW.wireControls(rows);
  const gl = new URLSearchParams(location.search).get("gl") === "1";
  const noLive = new URLSearchParams(location.search).get("live") === "0"; // drawn once (bench/live.py's control)
  let generation = 0;
  /* live: each run's cursor (the smallest of its figures'), what GET /api/v1/live takes */
  let cursors = {};
  let every = 1;
  let stream = null;

  /* About one bucket per 2.5 px of plot: each bucket returns its max (and min for run-level series),
     so spikes survive; more would not show and costs the server reads. */
  function buckets(div) {
    const w = div.clientWidth || 800;
    return Math.max(100, Math.min(400, Math.round(w / 2.5)));
  }

  function makeRows() {
    for (const name of INDICATORS) {
      rows.append(HW.el("section", { class: "row", id: "row-" + name },
        HW.el("div", { class: "fig line", id: "fig-" + name }),
        HW.el("div", { class: "side-col" },
          HW.el("div", { class: "fig side", id: "stab-" + name }),
          /* the verdict rule in HTML under the figure: it wraps to the panel (an annotation never wraps) */
          HW.el("p", { class: "rule-caption", id: "rule-" + name })),
        HW.el("p", { class: "missing", id: "missing-" + name })));
    }
  }

  async function drawOne(name, gen) {
    const div = document.getElementById("fig-" + name);
    const side = document.getElementById("stab-" + name);
    HW.begin();
    try {
      const body = await HW.api(`/ui/data/groups/${groupId}/compare`,
        { name, x: xSel.value, agg: aggSel.value, buckets: buckets(div), gl: gl ? "true" : "" });
      if (gen !== generation) return;
      for (const [id, c] of Object.entries(body.live)) {
        const old = cursors[id];
        cursors[id] = { step: old ? Math.min(old.step, c.step) : c.step, status: null };
        every = Math.max(every, c.every);
      }
      if (!body.runs) {
        div.classList.add("empty");
        /* meta.empty: why (router Z and MaxVio on a dense group: no router) */
        const why = body.figure.meta.empty || "no run of this group logs it";
        div.replaceChildren(HW.el("p", { class: "empty", text: `${name}: ${why}` }));
        side.replaceChildren();
        document.getElementById("rule-" + name).textContent = "";
        return;
      }
      div.classList.remove("empty");
      legendAdd(body.figure.data);
      hideRuns(body.figure.data);
      await HW.plot(div, body.figure);
      await controls.apply(div);
      await HW.plot(side, body.stability);
      document.getElementById("rule-" + name).textContent = body.stability.meta.rule || "";
      rowNotes.set(name, body.figure.meta);
      showNotes();
    } catch (err) {
      HW.fail(err);
    } finally {
      HW.end();
    }
  }

  /* One legend for the page: a run's label and colour; a click hides or shows it in every figure. */
  const legend = new Map();
  const hidden = new Set();

  function legendAdd(traces) {
    let added = false;
    for (const t of traces) {
      const m = t.meta || {};
      if (m.label === undefined || legend.has(m.run_id)) continue;
      legend.set(m.run_id, { label: m.label, colour: m.colour, rank: m.rank });
      added = true;
    }
    if (added) renderLegend();
  }

  function renderLegend() {
    const box = document.getElementById("legend");
    /* by size, as the server ranks the group's runs: figures answer in any order, and one holding
       only some runs must not put them first */
    const entries = Array.from(legend.entries()).sort((a, b) => a[1].rank - b[1].rank);
    box.replaceChildren(...entries.map(([id, e]) => HW.el("button", {
      type: "button", class: "legend-item" + (hidden.has(id) ? " off" : ""), "data-run-id": id,
      onclick: () => toggle(id) }, HW.el("span", { class: "swatch", style: `background:${e.colour}` }), e.label)));
  }

  function hideRuns(traces) {
    for (const t of traces) if (t.meta && hidden.has(t.meta.run_id)) t.visible = false;
  }

  function toggle(id) {
    if (hidden.has(id)) hidden.delete(id); else hidden.add(id);
    renderLegend();
    for (const div of rows.querySelectorAll(".fig.line.drawn")) {
      const idx = [], vis = [];
      div.data.forEach((t, i) => { if (t.meta && t.meta.run_id === id) { idx.push(i); vis.push(!hidden.has(id)); } });
      if (idx.length) Plotly.restyle(div, { visible: vis }, idx);
    }
  }

  /* One note for the page on the runs not drawn on this x-axis (the union over the rows, with the
     attach argument that fills the gap), under the first row that has any; not one under every row. */
  const rowNotes = new Map();
  function showNotes() {
    const names = [];
    let fix = "";
    let first = null;
    for (const name of INDICATORS) {
      const m = rowNotes.get(name);
      if (!m || !m.missing_runs || !m.missing_runs.length) continue;
      if (first === null) first = name;
      fix = fix || m.missing_fix;
      for (const r of m.missing_runs) if (!names.includes(r)) names.push(r);
    }
    const shown = names.slice(0, 5).join(", ") + (names.length > 5 ? ` and ${names.length - 5} more` : "");
    for (const name of INDICATORS) {
      const el = document.getElementById("missing-" + name);
      if (el) el.textContent = name === first ? `Not drawn on this x-axis: ${names.length} run(s) (${shown}): ${fix}` : "";
    }
  }

  async function drawAll() {
    const gen = ++generation;
    rowNotes.clear();
    cursors = {};
    every = 1;
    HW.begin();
    try {
      await Promise.all(INDICATORS.map((n) => drawOne(n, gen)));
      if (gen === generation && !stream && !noLive) stream = HW.live(liveParams, onNews, 500);
    } finally {
      HW.end();
    }
  }

  let statuses = null; // run id -> status the page was drawn with
  function liveParams() {
    const ids = Object.keys(cursors);
    if (!ids.length) return null;
    return { group_id: groupId, cursor: ids.map((id) => `${id}:${cursors[id].step}:${statuses && statuses[id] || ""}`),
      name: INDICATORS, line: [aggSel.value], every, x: xSel.value };
  }

  /* New points on each run's line; a new run or a run that changed status (the verdict's matching
     depends on it) redraws the page's figures. */
  async function onNews(body, asked) {
    if (asked.line[0] !== aggSel.value || asked.x !== xSel.value || !Object.keys(cursors).length) return;
    if (body.added.length) { await drawAll(); await header(); return; }
    const first = statuses === null;
    statuses = statuses || {};
    let changed = false;
    const draws = [], news = [];
    for (const r of body.runs) {
      if (!first && statuses[r.id] !== undefined && statuses[r.id] !== r.status) changed = true;
      statuses[r.id] = r.status;
      const c = cursors[r.id];
      if (!c) continue;
      c.step = Math.max(c.step, r.cursor);
      news.push([r.id, c.step]);
      for (const name of INDICATORS) {
        const d = r.series[name];
        const div = document.getElementById("fig-" + name);
        if (!d || !div.data) continue;
        const i = div.data.findIndex((t) => t.meta && t.meta.smooth && t.meta.run_id === r.id);
        if (i < 0) { changed = true; continue; } // the run's first points of this indicator
        if (HW.extendLine(div, i, d[aggSel.value] || d.run, 0.97 - 0.04 * (i % 12))) draws.push(div);
      }
    }
    if (changed) { await drawAll(); await header(); return; }
    await Promise.all(Array.from(new Set(draws)).map((div) => HW.redraw(div)));
    HW.painted(news);
  }

  async function header() {
    const g = await HW.api(`/api/v1/groups/${groupId}`);
    document.getElementById("group-title").textContent = `Scale comparison · ${g.project}/${g.name}`;
    document.title = `${g.name} · HyperWatch`;
    document.getElementById("sweeps-link").setAttribute("href", `/groups/${groupId}/sweeps`);
    const runs = await HW.api("/api/v1/runs", { project: g.project, group: g.name, limit: 1000 });
    const list = document.getElementById("group-runs");
    list.replaceChildren(...runs.map((r) => HW.el("li", {},
      HW.el("a", { href: `/runs/${r.id}`, text: r.name }),
      ` · ${r.status}` + (r.depth ? ` · d=${r.depth}` : "") + (r.total_params ? ` · ${HW.fmtCount(r.total_params)}` : ""))));
  }

  /* The thresholds the group's alerts use, each with its source (default / override / learned from the
     group's finished healthy runs) and how it came about: GET /api/v1/groups/{id}/thresholds. */
  async function thresholds() {
    const body = await HW.api(`/ui/data/groups/${groupId}/thresholds`);
    const counts = { default: 0, override: 0, learned: 0 };
    const rows = body.rows.map((t) => {
      counts[t.source] += 1;
      return HW.el("tr", { "data-key": t.key, "data-source": t.source },
        HW.el("td", {}, HW.el("code", { text: t.key })),
        HW.el("td", { class: "num", text: HW.fmtValue(t.value) }),
        HW.el("td", {}, HW.el("span", { class: `badge source-${t.source}`, text: t.source })),
        HW.el("td", { class: "num", text: HW.fmtValue(t.default) }),
        HW.el("td", { class: "detail", text: t.detail }));
    });
    document.querySelector("#thresholds-table tbody").replaceChildren(...rows);
    document.getElementById("thresholds-note").textContent =
      (body.learning ? "Learning on: growth floors and the logit ceiling are learned from this group's finished healthy runs. "
        : "Learning off (PATCH the group with learn_thresholds: true to learn from its finished healthy runs). ") +
      `${counts.override} overridden, ${counts.learned} learned, ${counts.default} default.`;
  }

  document.addEventListener("DOMContentLoaded", () => {
    makeRows();
    HW.begin();
    Promise.all([header(), drawAll(), thresholds()]).catch(HW.fail).finally(HW.end);
    xSel.addEventListener("change", drawAll);
    aggSel.addEventListener("change", drawAll);
  });
})();
