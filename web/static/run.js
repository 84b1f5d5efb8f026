/* Run page: every indicator vs step or tokens (mean and max over layers), per-layer heatmaps,
   loss and LR, alerts as diamonds, the config. ?name=...&step=... marks one point (alert links). */
"use strict";

(() => {
  const runId = HW.pageData("runId");
  const figures = document.getElementById("figures");
  const xSel = document.getElementById("x-axis");
  const controls = HW.wireControls(figures);
  const query = new URLSearchParams(location.search);
  const focus = { name: query.get("name"), step: query.get("step") };
  const gl = query.get("gl") === "1";
  const FIRST = ["loss", "lr", "attention_z", "router_z", "attention_rms", "mlp_rms", "attention_outlier_ratio",
    "mlp_outlier_ratio", "max_vio", "grad_norm"];
  let names = [];
  let generation = 0;
  /* live: where the page's drawing stops (the smallest cursor of its figures), as GET /api/v1/live takes it */
  let run = null;
  const perLayer = {};
  let cursor = null;
  let every = 1;
  let alertAfter = 0;
  let stream = null;

  function order(all) {
    // per-head ceilings (attention_lse_max.h<k>) are drawn as their layer's max (attention_lse_max), not one chart each
    const rest = all.filter((n) => !FIRST.includes(n) && n !== "val_loss" && n !== "tokens" && !/^attention_lse_max\.h\d+$/.test(n)).sort();
    return FIRST.filter((n) => all.includes(n)).concat(rest);
  }

  function meta(run) {
    const box = document.getElementById("run-meta");
    const items = [["status", run.status], ["project", run.project], ["group", run.group],
      ["depth", run.depth], ["width", run.width], ["params", HW.fmtCount(run.total_params)],
      ["active params", HW.fmtCount(run.active_params)], ["tokens", HW.fmtCount(run.tokens)],
      ["FLOPs", run.flops ? run.flops.toExponential(2) : null], ["lr", run.lr], ["optimizer", run.optimizer],
      ["parameterization", run.parameterization], ["last step", run.last_step], ["tags", (run.tags || []).join(" ")]];
    box.replaceChildren(...items.filter(([, v]) => v !== null && v !== undefined && v !== "")
      .map(([k, v]) => HW.el("span", { class: "kv" }, HW.el("b", { text: k }), " ", String(v))));
    if (run.group_id) {
      box.append(HW.el("a", { href: `/groups/${run.group_id}`, text: "compare across scales →" }));
    }
    const table = document.getElementById("config");
    const rows = [];
    (function walk(prefix, obj) {
      for (const [k, v] of Object.entries(obj || {})) {
        const key = prefix ? `${prefix}.${k}` : k;
        if (v && typeof v === "object" && !Array.isArray(v)) walk(key, v);
        else rows.push(HW.el("tr", {}, HW.el("td", { text: key }), HW.el("td", { text: JSON.stringify(v) })));
      }
    })("", run.config);
    table.replaceChildren(...rows);
    unavailable(run.unavailable || {});
  }

  const SYSTEM = { cuda_max_memory_allocated: "CUDA peak memory allocated (rank 0, running max)",
    host_rss: "host RSS (rank 0)" };

  function fmtBytes(v) {
    if (typeof v !== "number") return String(v);
    for (const [d, s] of [[2 ** 40, "TiB"], [2 ** 30, "GiB"], [2 ** 20, "MiB"], [2 ** 10, "KiB"]]) {
      if (Math.abs(v) >= d) return `${(v / d).toFixed(2)} ${s}`;
    }
    return `${v} B`;
  }

  /* What the run ran on (the hooks store it in config._hyperwatch) and the newest system metrics. */
  function environment(config, index) {
    const hw = (config && config._hyperwatch) || {};
    const box = document.getElementById("environment");
    const rows = [];
    const add = (key, value) => { if (value !== null && value !== undefined && value !== "") rows.push([key, String(value)]); };
    let commit = null;
    if (hw.git_commit) commit = hw.git_commit + (hw.git_dirty === true ? " (dirty: uncommitted changes)" : hw.git_dirty === false ? " (clean)" : "");
    else if (hw.git_unavailable) commit = `unknown: ${hw.git_unavailable}`;
    add("git commit", commit);
    add("host", hw.host);
    add("python", hw.python);
    add("torch", hw.torch);
    add("CUDA", hw.cuda);
    add("cuDNN", hw.cudnn);
    const count = hw.device_count > 1 ? ` × ${hw.device_count}` : "";
    add("device", hw.device_name ? `${hw.device_name}${count} (${hw.device})` : hw.device);
    add("world size", hw.world_size);
    for (const [name, label] of Object.entries(SYSTEM)) {
      const last = (index || []).filter((s) => s.name === name && s.layer === null).sort((a, b) => b.step - a.step)[0];
      if (last) add(label, `${fmtBytes(last.value)} at step ${last.step}`);
    }
    box.hidden = rows.length === 0;
    const short = hw.git_commit ? hw.git_commit.slice(0, 10) + (hw.git_dirty ? " dirty" : "") : null;
    box.querySelector("summary").textContent = ["Environment", short, hw.host, hw.device_name || hw.device]
      .filter((v) => v).join(" · ");
    document.getElementById("env-table").replaceChildren(...rows.map(([k, v]) =>
      HW.el("tr", {}, HW.el("th", { text: k }), HW.el("td", { text: v }))));
  }

  /* What the hooks could not measure, with their reason and fix: a missing panel is explained. */
  function unavailable(items) {
    const box = document.getElementById("unavailable");
    const keys = Object.keys(items).sort();
    box.hidden = keys.length === 0;
    if (!keys.length) return;
    box.querySelector("summary").textContent =
      `${keys.length} indicator${keys.length > 1 ? "s" : ""} not measured by the hooks: ${keys.slice(0, 6).join(", ")}` +
      (keys.length > 6 ? ", …" : "");
    box.querySelector("ul").replaceChildren(...keys.map((k) =>
      HW.el("li", {}, HW.el("b", { text: k }), " ", items[k])));
  }

  const HEADS = "attention_lse_max"; // its per-head values get a heads x layers heatmap under its row

  function section(name) {
    const s = HW.el("section", { class: "run-row", id: "row-" + name },
      HW.el("div", { class: "fig line", id: "fig-" + name }),
      HW.el("div", { class: "fig heat", id: "heat-" + name }));
    if (name === HEADS) s.append(HW.el("div", { class: "fig heads", id: "heads-" + name }));
    figures.append(s);
    return s;
  }

  /* Each head's max LSE per layer at the newest logged step (drawn anew: the matrix is small). */
  async function drawHeads() {
    const div = document.getElementById("heads-" + HEADS);
    if (!div) return;
    headsAt = performance.now();
    await HW.plot(div, await HW.api(`/ui/data/runs/${runId}/heads`));
  }

  /* While the run streams the heatmap is read again at most every HEADS_GAP_MS (one more request per
     logged step would double what an open page asks of the service); the last news is always drawn. */
  const HEADS_GAP_MS = 5000;
  let headsAt = 0, headsLater = null;
  function liveHeads() {
    const wait = HEADS_GAP_MS - (performance.now() - headsAt);
    if (wait <= 0) return drawHeads();
    if (!headsLater) headsLater = setTimeout(() => { headsLater = null; drawHeads().catch(HW.fail); }, wait);
    return Promise.resolve();
  }

  function markFocus(div, name) {
    if (!focus.step || focus.name !== name || xSel.value !== "step") return Promise.resolve();
    const x = Number(focus.step);
    return Plotly.relayout(div, { shapes: [{ type: "line", x0: x, x1: x, yref: "paper", y0: 0, y1: 1,
      line: { color: "#d62728", width: 2, dash: "dot" } }] });
  }

  async function drawOne(name, gen) {
    const line = document.getElementById("fig-" + name);
    const heat = document.getElementById("heat-" + name);
    HW.begin();
    try {
      const body = await HW.api(`/ui/data/runs/${runId}/indicator`,
        { name, x: xSel.value, buckets: Math.max(100, Math.round((line.clientWidth || 800) / 1.5)), gl: gl ? "true" : "" });
      if (gen !== generation) return;
      perLayer[name] = body.per_layer;
      cursor = cursor === null ? body.live.step : Math.min(cursor, body.live.step);
      every = Math.max(every, body.live.every);
      alertAfter = Math.max(alertAfter, body.live.alert_after);
      if (!body.heatmap) { heat.hidden = true; line.parentElement.classList.add("single"); }
      await HW.plot(line, body.line);
      await controls.apply(line);
      await markFocus(line, name);
      if (body.heatmap) await HW.plot(heat, body.heatmap);
      if (focus.name === name) line.scrollIntoView();
    } catch (err) {
      HW.fail(err);
    } finally {
      HW.end();
    }
  }

  async function drawAll() {
    const gen = ++generation;
    cursor = null;
    every = 1;
    HW.begin();
    /* the heads heatmap is asked for with the figures, not after its row is drawn (one round trip less) */
    const heads = names.includes(HEADS) ? [drawHeads().catch(HW.fail)] : [];
    try { await Promise.all(names.map((n) => drawOne(n, gen)).concat(heads)); } finally { HW.end(); }
  }

  /* Draw what the live stream brought: new points on each line and heatmap, new alerts, status and step. */
  async function onNews(body, asked) {
    const r = body.runs[0];
    if (!r || cursor === null || asked.x !== xSel.value) return; // the page redrew meanwhile
    const wasEmpty = cursor < 0 && !names.length;
    cursor = Math.max(cursor, r.cursor);
    if (r.status !== run.status || r.last_step !== run.last_step) {
      run.status = r.status;
      run.last_step = r.last_step;
      meta(run);
    }
    if (wasEmpty && r.last_step !== null) { await load(); return; } // the first points: draw the page
    for (const a of r.alerts) alertAfter = Math.max(alertAfter, a.id);
    const draws = [];
    for (const name of names) {
      const line = document.getElementById("fig-" + name);
      const heat = document.getElementById("heat-" + name);
      const d = r.series[name] || {};
      let n = 0;
      if (!line.data) continue;
      if (perLayer[name]) {
        n += HW.extendLine(line, 0, d.mean, 0.97) + HW.extendLine(line, 1, d.max, 0.92);
        if (heat.data && HW.extendHeat(heat, d.heat)) draws.push(HW.redraw(heat));
      } else {
        n += HW.extendLine(line, 0, d.run, 0.97);
        if (name === "loss" && r.series.val_loss) n += HW.extendLine(line, 1, r.series.val_loss.run, 0.92);
      }
      n += HW.extendAlerts(line, r.alerts.filter((a) => a.name === name), HW.escHtml);
      if (n) draws.push(HW.redraw(line));
      if (n && name === HEADS) draws.push(liveHeads());
    }
    await Promise.all(draws);
    HW.painted([[Number(runId), cursor]]);
  }

  function liveParams() {
    if (cursor === null || !run) return null;
    const wanted = names.length ? names.concat(names.includes("loss") ? ["val_loss"] : []) : ["loss"];
    return { cursor: `${runId}:${cursor}:${run.status}`, name: wanted, line: ["mean", "max", "heat"], every,
      x: xSel.value, alert_after: alertAfter };
  }

  async function load() {
    const [fresh, index] = await Promise.all([HW.api(`/api/v1/runs/${runId}`), HW.api(`/api/v1/runs/${runId}/series_index`)]);
    run = fresh;
    document.getElementById("run-title").textContent = `${run.project}/${run.name}`;
    document.title = `${run.name} · HyperWatch`;
    meta(run);
    environment(run.config, index);
    names = order(Array.from(new Set(index.map((s) => s.name))));
    HW.status(names.length ? "" : "This run has no points yet: they appear here as they arrive.");
    figures.replaceChildren();
    names.forEach(section);
    await drawAll();
    if (!names.length) cursor = -1;
    /* at most one answer per 0.4 s: a run logging faster than that is drawn a few steps at a time */
    if (!stream && query.get("live") !== "0") stream = HW.live(liveParams, onNews, 400);
  }

  document.addEventListener("DOMContentLoaded", () => {
    if (query.get("x") === "tokens") xSel.value = "tokens";
    HW.begin();
    load().catch(HW.fail).finally(HW.end);
    xSel.addEventListener("change", () => drawAll().catch(HW.fail));
  });
})();
