/* Compare page: any runs (across groups and projects) on one chart: one indicator, the mean or max over
   layers or one layer, x by step / tokens / FLOPs / fraction. The whole state is in the query string
   (run_id=..&name=..&layer=..&x=..&log=1&ema=1), so the URL is the link to share; live while open. */
"use strict";

(() => {
  const div = document.getElementById("fig-compare");
  const nameSel = document.getElementById("name");
  const layerSel = document.getElementById("layer");
  const xSel = document.getElementById("x-axis");
  const logY = document.getElementById("log-y");
  const smooth = document.getElementById("ema");
  const controls = HW.wireControls(document.getElementById("rows"));
  const gl = new URLSearchParams(location.search).get("gl") === "1";
  let ids = [];
  let runs = [];
  let cursors = {}; // run id -> {step, status}
  let every = 1;
  let alertAfter = 0;
  let generation = 0;
  let stream = null;
  const hidden = new Set();

  function state() {
    const q = new URLSearchParams();
    ids.forEach((id) => q.append("run_id", id));
    q.set("name", nameSel.value || "attention_z");
    q.set("layer", layerSel.value);
    q.set("x", xSel.value);
    if (logY.checked) q.set("log", "1");
    if (smooth.checked) q.set("ema", "1");
    return q;
  }

  function save() {
    const url = `${location.pathname}?${state()}`;
    history.replaceState(null, "", url);
    document.getElementById("share").setAttribute("href", url);
  }

  function options(sel, values, labels, keep) {
    const old = keep || sel.value;
    sel.replaceChildren(...values.map((v, i) => HW.el("option", { value: v, text: labels ? labels[i] : v })));
    if (values.includes(old)) sel.value = old;
  }

  function legend() {
    const box = document.getElementById("legend");
    box.replaceChildren(...runs.map((r) => HW.el("span", { class: "legend-entry" },
      HW.el("button", { type: "button", class: "legend-item" + (hidden.has(r.id) ? " off" : ""), "data-run-id": r.id,
        onclick: () => toggle(r.id) }, HW.el("span", { class: "swatch", style: `background:${r.colour}` }), r.label),
      " ", HW.el("a", { href: `/runs/${r.id}`, text: r.status + (r.last_step !== null ? ` · step ${r.last_step}` : "") }),
      " ", HW.el("button", { type: "button", class: "remove", title: "remove from the comparison", text: "×",
        onclick: () => { ids = ids.filter((i) => i !== r.id); draw(); } }))));
  }

  function toggle(id) {
    if (hidden.has(id)) hidden.delete(id); else hidden.add(id);
    legend();
    const idx = [], vis = [];
    (div.data || []).forEach((t, i) => { if (t.meta && t.meta.run_id === id) { idx.push(i); vis.push(!hidden.has(id)); } });
    if (idx.length) Plotly.restyle(div, { visible: vis }, idx);
  }

  async function draw() {
    const gen = ++generation;
    save();
    if (!ids.length) {
      HW.status("No runs picked: tick runs on the Runs page and press \"Compare selected\".");
      div.replaceChildren();
      runs = [];
      legend();
      return;
    }
    HW.begin();
    try {
      cursors = {};
      const body = await HW.api("/ui/data/compare", { run_id: ids, name: nameSel.value || "attention_z",
        layer: layerSel.value, x: xSel.value, buckets: Math.max(100, Math.min(400, Math.round((div.clientWidth || 1000) / 2.5))),
        gl: gl ? "true" : "" });
      if (gen !== generation) return;
      runs = body.runs;
      options(nameSel, body.names, null, nameSel.value || new URLSearchParams(location.search).get("name"));
      const layers = ["mean", "max"].concat(Array.from({ length: body.layers }, (_, i) => String(i)));
      options(layerSel, layers, ["mean over layers", "max over layers"].concat(layers.slice(2).map((l) => `layer ${l}`)));
      for (const t of body.figure.data) if (t.meta && hidden.has(t.meta.run_id)) t.visible = false;
      await HW.plot(div, body.figure);
      await controls.apply(div);
      const notes = body.figure.meta.missing;
      document.getElementById("missing").textContent = notes.length ? "Not drawn: " + notes.join("; ") : "";
      document.getElementById("compare-title").textContent = `Compare ${runs.length} run${runs.length > 1 ? "s" : ""}`;
      every = 1;
      for (const r of runs) {
        cursors[r.id] = { step: body.live[r.id].step, status: r.status };
        every = Math.max(every, body.live[r.id].every);
      }
      legend();
      HW.status("");
      if (!stream) stream = HW.live(liveParams, onNews, 500);
    } catch (err) {
      HW.fail(err);
    } finally {
      HW.end();
    }
  }

  function liveParams() {
    if (!runs.length || !Object.keys(cursors).length) return null;
    return { cursor: runs.map((r) => `${r.id}:${cursors[r.id].step}:${cursors[r.id].status}`),
      name: nameSel.value, line: [layerSel.value], every, x: xSel.value, alert_after: alertAfter };
  }

  async function onNews(body, asked) {
    if (asked.name !== nameSel.value || asked.line[0] !== layerSel.value || asked.x !== xSel.value) return;
    const news = [];
    let n = 0, moved = false;
    for (const r of body.runs) {
      const c = cursors[r.id];
      if (!c) continue;
      for (const a of r.alerts) alertAfter = Math.max(alertAfter, a.id);
      if (r.status !== c.status) moved = true;
      c.step = Math.max(c.step, r.cursor);
      c.status = r.status;
      const run = runs.find((x) => x.id === r.id);
      if (run) { run.status = r.status; run.last_step = r.last_step; }
      const d = (r.series[nameSel.value] || {});
      const delta = d[layerSel.value] || d.run;
      if (!div.data) continue;
      const i = div.data.findIndex((t) => t.meta && t.meta.smooth && t.meta.run_id === r.id);
      if (i < 0) { if (delta && delta.x.length) { await draw(); return; } continue; } // the run's first points
      n += HW.extendLine(div, i, delta, 0.97 - 0.04 * (i % 12));
      news.push([r.id, c.step]);
    }
    if (n) await HW.redraw(div);
    if (n || moved) legend();
    HW.painted(news);
  }

  async function start() {
    const q = new URLSearchParams(location.search);
    ids = q.getAll("run_id").map(Number).filter((n) => Number.isInteger(n) && n > 0);
    if (!ids.length && (q.get("project") || q.get("group") || q.get("tag"))) {
      const found = await HW.api("/api/v1/runs", { project: q.get("project"), group: q.get("group"),
        tag: q.getAll("tag"), limit: 200 });
      ids = found.map((r) => r.id);
    }
    if (q.get("name")) options(nameSel, [q.get("name")]);
    if (q.get("layer")) options(layerSel, ["mean", "max", q.get("layer")].filter((v, i, a) => a.indexOf(v) === i));
    layerSel.value = q.get("layer") || "mean";
    if (q.get("x")) xSel.value = q.get("x");
    logY.checked = q.get("log") === "1";
    smooth.checked = q.get("ema") === "1";
    await draw();
  }

  document.addEventListener("DOMContentLoaded", () => {
    HW.begin();
    start().catch(HW.fail).finally(HW.end);
    for (const el of [nameSel, layerSel, xSel]) el.addEventListener("change", () => draw());
    for (const el of [logY, smooth]) el.addEventListener("change", save);
  });
})();
