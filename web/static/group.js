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
  let generation = 0;

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
        HW.el("div", { class: "fig side", id: "stab-" + name }),
        HW.el("p", { class: "missing", id: "missing-" + name })));
    }
  }

  async function drawOne(name, gen) {
    const div = document.getElementById("fig-" + name);
    const side = document.getElementById("stab-" + name);
    const missing = document.getElementById("missing-" + name);
    HW.begin();
    try {
      const body = await HW.api(`/ui/data/groups/${groupId}/compare`,
        { name, x: xSel.value, agg: aggSel.value, buckets: buckets(div), gl: gl ? "true" : "" });
      if (gen !== generation) return;
      if (!body.runs) {
        div.classList.add("empty");
        div.replaceChildren(HW.el("p", { class: "empty", text: `${name}: no run of this group logs it` }));
        side.replaceChildren();
        return;
      }
      div.classList.remove("empty");
      legendAdd(body.figure.data);
      hideRuns(body.figure.data);
      await HW.plot(div, body.figure);
      await controls.apply(div);
      await HW.plot(side, body.stability);
      const notes = body.figure.meta.missing;
      missing.textContent = notes.length ? "Not drawn on this x-axis: " + notes.join("; ") : "";
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

  async function drawAll() {
    const gen = ++generation;
    HW.begin();
    try {
      await Promise.all(INDICATORS.map((n) => drawOne(n, gen)));
    } finally {
      HW.end();
    }
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

  document.addEventListener("DOMContentLoaded", () => {
    makeRows();
    HW.begin();
    Promise.all([header(), drawAll()]).catch(HW.fail).finally(HW.end);
    xSel.addEventListener("change", drawAll);
    aggSel.addEventListener("change", drawAll);
  });
})();
