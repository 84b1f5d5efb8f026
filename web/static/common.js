/* HyperWatch pages: shared helpers. User strings are only ever written with textContent. */
"use strict";

const HW = (() => {
  const TOKEN_KEY = "hyperwatch.read_token";
  const state = { pending: 0, drawn: 0, started: performance.now() };

  function token() {
    try { return sessionStorage.getItem(TOKEN_KEY); } catch (e) { return null; }
  }

  /* A DOM element; children are nodes or strings (strings become text nodes, never HTML). */
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = String(v);
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, String(v));
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  function status(text, isError) {
    const s = document.getElementById("status");
    if (!s) return;
    s.textContent = text || "";
    s.classList.toggle("error", !!isError);
  }

  function askToken() {
    const form = document.getElementById("token-form");
    form.hidden = false;
    status("This service needs its read token for reads: enter it above.", true);
    return new Promise((resolve) => {
      form.addEventListener("submit", (ev) => {
        ev.preventDefault();
        const value = document.getElementById("token-input").value.trim();
        try { sessionStorage.setItem(TOKEN_KEY, value); } catch (e) { /* private mode: kept for this page only */ }
        HW.memoryToken = value;
        form.hidden = true;
        status("");
        resolve();
      }, { once: true });
    });
  }

  /* GET path with params, asking for the read token on 401/403 (three times); the response when 2xx,
     else an error carrying the service's message. */
  async function request(path, params, signal) {
    const url = new URL(path, location.origin);
    for (const [k, v] of Object.entries(params || {})) {
      if (Array.isArray(v)) v.forEach((x) => url.searchParams.append(k, x));
      else if (v !== null && v !== undefined && v !== "") url.searchParams.set(k, v);
    }
    for (let attempt = 0; attempt < 3; attempt++) {
      const t = HW.memoryToken || token();
      const headers = t ? { Authorization: "Bearer " + t } : {};
      const r = await fetch(url, { headers, signal });
      if (r.status === 401 || r.status === 403) { await askToken(); continue; }
      if (r.ok) return r;
      const body = await r.json().catch(() => null);
      const detail = body && (body.message || body.detail);
      throw new Error(typeof detail === "string" ? detail : `${r.status} ${r.statusText} for ${url.pathname}`);
    }
    throw new Error("the read token was refused three times");
  }

  /* GET JSON (see request). */
  async function api(path, params) {
    return (await request(path, params)).json();
  }

  /* Track figures in flight: body[data-ready] = "1" once every started figure is drawn. */
  function begin() { state.pending++; document.body.dataset.ready = "0"; }
  function end() {
    state.pending--;
    state.drawn++;
    if (state.pending === 0) {
      window.hwReadyAt = performance.now();
      document.body.dataset.ready = "1";
    }
  }

  const PLOT_CONFIG = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["select2d", "lasso2d"] };

  const GAP = 0.02; // legends and colour bars sit at x = 1.02 (web/layout.py PAPER_GAP)

  /* The right margin a legend or colour bar of room px needs at this div's width: Plotly puts it 2% of
     the plot's width right of the plot, and would push a narrower margin out by a second layout pass. */
  function fitRight(div, fig) {
    const room = fig.meta && fig.meta.room_right, margin = fig.layout.margin;
    if (!room || !margin || fig.layout.width) return;
    const width = parseFloat(getComputedStyle(div).width); // what Plotly reads for its width
    if (!(width > 0)) return;
    margin.r = Math.max(20, Math.ceil((room + GAP * (width - margin.l)) / (1 + GAP)) + 1);
  }

  /* Draw a figure ({data, layout}) into div; keeps the raw y of smoothable traces for the EMA. */
  async function plot(div, fig) {
    div._raw = fig.data.map((t) => (t.meta && t.meta.smooth ? t.y.slice() : null));
    fitRight(div, fig);
    await Plotly.react(div, fig.data, fig.layout, Object.assign({}, PLOT_CONFIG, fig.config || {}));
    div.classList.add("drawn");
    return div;
  }

  /* TensorBoard-style debiased EMA; null (a non-finite value) stays null and does not move the average. */
  function ema(y, weight) {
    const out = new Array(y.length);
    let last = 0, n = 0;
    for (let i = 0; i < y.length; i++) {
      const v = y[i];
      if (v === null || v === undefined || !isFinite(v)) { out[i] = null; continue; }
      last = last * weight + (1 - weight) * v;
      n++;
      out[i] = last / (1 - Math.pow(weight, n));
    }
    return out;
  }

  const EMA_WEIGHT = 0.6;

  function applySmoothing(div, on) {
    if (!div._raw || !div.data) return Promise.resolve();
    const idx = [], ys = [];
    div._raw.forEach((raw, i) => { if (raw) { idx.push(i); ys.push(on ? ema(raw, EMA_WEIGHT) : raw.slice()); } });
    div._smooth = on;
    if (!idx.length) return Promise.resolve();
    return Plotly.restyle(div, { y: ys }, idx);
  }

  function applyLogY(div, on) {
    if (!div.data) return Promise.resolve();
    return Plotly.relayout(div, { "yaxis.type": on ? "log" : "linear" });
  }

  /* Wire the log-y and EMA checkboxes to every figure with class "line" inside root. */
  function wireControls(root) {
    const logY = document.getElementById("log-y");
    const smooth = document.getElementById("ema");
    const figs = () => Array.from(root.querySelectorAll(".fig.line.drawn"));
    if (logY) logY.addEventListener("change", () => Promise.all(figs().map((d) => applyLogY(d, logY.checked))));
    if (smooth) smooth.addEventListener("change", () => Promise.all(figs().map((d) => applySmoothing(d, smooth.checked))));
    return {
      /* re-apply the current toggles to a freshly drawn figure */
      async apply(div) {
        if (logY && logY.checked) await applyLogY(div, true);
        if (smooth && smooth.checked) await applySmoothing(div, true);
      },
    };
  }

  function fmtCount(n) {
    if (n === null || n === undefined) return "";
    const a = Math.abs(n);
    for (const [d, s] of [[1e12, "T"], [1e9, "B"], [1e6, "M"], [1e3, "K"]]) if (a >= d) return (n / d).toPrecision(3).replace(/\.?0+$/, "") + s;
    return String(n);
  }

  function parseCount(text) {
    const m = /^\s*([0-9.]+)\s*([kKmMbBtT]?)\s*$/.exec(text || "");
    if (!m) return null;
    const mult = { "": 1, k: 1e3, m: 1e6, b: 1e9, t: 1e12 }[m[2].toLowerCase()];
    return parseFloat(m[1]) * mult;
  }

  function fmtValue(v) {
    if (typeof v === "string") return v; // "NaN", "Infinity", "-Infinity": shown as they are
    if (v === null || v === undefined) return "";
    return Math.abs(v) >= 1e4 || (Math.abs(v) < 1e-3 && v !== 0) ? v.toExponential(3) : String(+v.toPrecision(5));
  }

  function fail(err) {
    console.warn(err);
    status(String(err && err.message ? err.message : err), true);
  }

  /* ---- live charts: GET /api/v1/live (a long poll on per-run cursors; only new points travel) ---- */
  const NF_SYMBOL = { NaN: "x", Infinity: "triangle-up", "-Infinity": "triangle-down" };
  const NF_COLOUR = "#d62728";

  function lastX(trace) {
    for (let k = trace.x.length - 1; k >= 0; k--) if (trace.x[k] !== null && trace.x[k] !== undefined) return trace.x[k];
    return -Infinity;
  }

  /* A page left open on a long run would gather a point per logged step: past twice what it drew
     first (at least 2,000), a line is thinned the way the server downsamples, each of half that many
     buckets keeping its first, its min and its max point (spikes survive) and every gap (a NaN). */
  function thin(div, i) {
    const t = div.data[i];
    const limit = div._limit || (div._limit = Math.max(2000, 2 * Math.max(...div.data.map((d) => (d.x || []).length))));
    if (t.x.length <= limit) return;
    const ys = div._raw && div._raw[i] ? div._raw[i] : t.y;
    const n = t.x.length, buckets = Math.floor(limit / 2);
    const lo = t.x[0], width = (t.x[n - 1] - lo) / buckets || 1;
    const keep = new Set([0, n - 1]);
    const ext = new Map();
    for (let k = 0; k < n; k++) {
      const y = ys[k];
      if (y === null || y === undefined) { keep.add(k); continue; }
      const b = Math.min(buckets - 1, Math.floor((t.x[k] - lo) / width));
      const e = ext.get(b);
      if (!e) { ext.set(b, [k, k, k]); continue; }
      if (y < ys[e[1]]) e[1] = k;
      if (y > ys[e[2]]) e[2] = k;
    }
    for (const e of ext.values()) e.forEach((k) => keep.add(k));
    const idx = Array.from(keep).sort((a, b) => a - b);
    t.x = idx.map((k) => t.x[k]);
    if (div._raw && div._raw[i]) div._raw[i] = idx.map((k) => div._raw[i][k]);
    else t.y = idx.map((k) => t.y[k]);
  }

  /* Append a delta ({x, y, step}) to line trace i of div: points at or before the trace's last x are
     already drawn and dropped; a non-finite value ("NaN", "Infinity", "-Infinity") is a gap in the
     line and a red marker on the overlay axis in the lane given, as the server draws it.
     Returns the number of points appended; the figure is redrawn by the caller (HW.redraw). */
  function extendLine(div, i, delta, lane) {
    const t = div.data[i];
    if (!t || !t.meta || !t.meta.smooth || !delta || !delta.x.length) return 0;
    const after = lastX(t);
    const xs = [], ys = [], nf = [];
    delta.x.forEach((x, k) => {
      if (x === null || x <= after) return;
      const v = delta.y[k];
      xs.push(x);
      if (typeof v === "string") { ys.push(null); nf.push([x, v]); } else ys.push(v);
    });
    if (!xs.length) return 0;
    t.x = t.x.concat(xs);
    const raw = div._raw && div._raw[i];
    if (raw) div._raw[i] = raw.concat(ys);
    else t.y = t.y.concat(ys);
    thin(div, i);
    if (raw) t.y = div._smooth ? ema(div._raw[i], EMA_WEIGHT) : div._raw[i].slice();
    if (nf.length) {
      const colour = (t.line && t.line.color) || "#555";
      div.data.push({ type: "scatter", mode: "markers", x: nf.map((p) => p[0]), y: nf.map(() => lane), yaxis: "y2",
        name: `${t.name} · non-finite`, legendgroup: t.legendgroup, showlegend: false, text: nf.map((p) => p[1]),
        hovertemplate: "%{fullData.name}<br>%{text} at %{x}<extra></extra>",
        marker: { color: NF_COLOUR, size: 10, symbol: nf.map((p) => NF_SYMBOL[p[1]]), line: { color: colour, width: 1.5 } },
        meta: Object.assign({}, t.meta, { nonfinite: true, smooth: false }) });
      if (div._raw) div._raw.push(null);
    }
    return xs.length;
  }

  /* Append a heatmap delta ({x, z: rows by layer, layers}) as new columns of div's heatmap trace. */
  function extendHeat(div, delta) {
    const t = div.data && div.data[0];
    if (!t || !delta || !delta.x.length) return 0;
    const after = lastX(t);
    const cols = [];
    delta.x.forEach((x, k) => { if (x !== null && x > after) cols.push(k); });
    if (!cols.length) return 0;
    const row = new Map(delta.layers.map((layer, r) => [layer, r]));
    const nf = [];
    t.x = t.x.concat(cols.map((k) => delta.x[k]));
    t.z = t.y.map((layer, r) => {
      const src = row.get(layer);
      return t.z[r].concat(cols.map((k) => {
        const v = src === undefined ? null : delta.z[src][k];
        if (typeof v === "string") { nf.push([delta.x[k], layer, v]); return null; }
        return v;
      }));
    });
    /* past twice its first width (at least 600 columns), neighbouring columns merge into one, each
       cell the max of the two: the heatmap's own rule (a layer's max per bucket), at twice the bucket */
    const limit = div._limit || (div._limit = Math.max(600, 2 * (t.x.length - cols.length)));
    while (t.x.length > limit) {
      const pairs = (row) => row.filter((_, k) => k % 2 === 0).map((v, h) => {
        const w = row[2 * h + 1];
        return v === null || v === undefined ? (w ?? null) : (w === null || w === undefined ? v : Math.max(v, w));
      });
      t.z = t.z.map(pairs);
      t.x = t.x.filter((_, k) => k % 2 === 0);
    }
    if (nf.length) {
      div.data.push({ type: "scatter", mode: "markers", x: nf.map((p) => p[0]), y: nf.map((p) => p[1]),
        text: nf.map((p) => p[2]), name: "non-finite", hovertemplate: "layer %{y}<br>%{text} at %{x}<extra></extra>",
        marker: { color: NF_COLOUR, symbol: "x", size: 9 }, meta: { nonfinite: true } });
    }
    return cols.length;
  }

  /* New alert events as diamonds on the figure's alert lane (a trace is added for the first one). */
  function extendAlerts(div, alerts, esc) {
    if (!alerts.length) return 0;
    let t = div.data.find((d) => d.meta && d.meta.alerts);
    if (!t) {
      t = { type: "scatter", mode: "markers", x: [], y: [], yaxis: "y3", name: "alerts", text: [], customdata: [],
        hovertemplate: "%{text}<extra></extra>", meta: { alerts: true },
        marker: { symbol: "diamond", size: 11, color: "#ff9f1c", line: { color: "#000", width: 1 } } };
      div.data.push(t);
      if (div._raw) div._raw.push(null);
    }
    const known = new Set(t.customdata);
    const fresh = alerts.filter((a) => a.x !== null && !known.has(a.step));
    if (!fresh.length) return 0;
    t.x = t.x.concat(fresh.map((a) => a.x));
    t.y = t.y.concat(fresh.map(() => 0.5)); // the alert strip's lane (web/figures.py ALERT_LANE)
    t.showlegend = true;
    t.customdata = t.customdata.concat(fresh.map((a) => a.step));
    t.text = t.text.concat(fresh.map((a) => esc(`${a.rule} (${a.severity}) step ${a.step}: ${a.message}`)));
    return fresh.length;
  }

  /* Figures out of the viewport are not redrawn for each live answer: they are marked and redrawn
     when they scroll into view (a page of 16 figures costs the drawing of the 2-4 one sees). */
  const onScreen = new WeakMap();
  const watcher = typeof IntersectionObserver === "undefined" ? null : new IntersectionObserver((entries) => {
    for (const e of entries) {
      onScreen.set(e.target, e.isIntersecting);
      if (e.isIntersecting && e.target._dirty) { e.target._dirty = false; redraw(e.target); }
    }
  }, { rootMargin: "200px" });

  /* Redraw div from its (extended) data: Plotly.react keeps zoom (uirevision) and costs no request. */
  function redraw(div) {
    if (watcher && !div._watched) { div._watched = true; watcher.observe(div); }
    if (onScreen.get(div) === false) { div._dirty = true; return Promise.resolve(); }
    div.layout.datarevision = (div.layout.datarevision || 0) + 1; // arrays were replaced in place
    return Plotly.react(div, div.data, div.layout);
  }

  /* Escape text for Plotly's hover labels (it renders a subset of HTML), as the server's web.scale.esc does. */
  function escHtml(s) {
    return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
  }

  /* Note, after the next paint, that the page now shows each run up to its step: window.hwLiveLog gets
     [run_id, step, epoch ms] (bench/live.py measures from a point's ingest to its pixel with it). */
  function painted(steps) {
    requestAnimationFrame(() => requestAnimationFrame(() => {
      const at = performance.timeOrigin + performance.now();
      window.hwLiveLog = window.hwLiveLog || [];
      for (const [run, step] of steps) window.hwLiveLog.push([run, step, at]);
      if (window.hwLiveLog.length > 5000) window.hwLiveLog.splice(0, 1000);
    }));
  }

  /* What a stream of the live news assumes the page asks next, once the page has drawn body: each
     run's cursor and status as answered, alert_after past the alerts sent (GET /api/v1/live/stream). */
  function nextAsk(p, body) {
    const q = Object.assign({}, p);
    const now = new Map(body.runs.map((r) => [String(r.id), `${r.id}:${r.cursor}:${r.status}`]));
    const move = (c) => now.get(String(c).split(":")[0]) || c;
    if (p.cursor !== undefined) q.cursor = Array.isArray(p.cursor) ? p.cursor.map(move) : move(p.cursor);
    if (p.alert_after !== undefined) {
      q.alert_after = Math.max(p.alert_after, ...body.runs.flatMap((r) => r.alerts.map((a) => a.id)));
    }
    return q;
  }

  function sameAsk(a, b) {
    const key = (p) => JSON.stringify(Object.keys(p).sort().map((k) =>
      [k, k === "cursor" && Array.isArray(p[k]) ? p[k].slice().sort() : p[k]]));
    return !!a && !!b && key(a) === key(b);
  }

  /* Draw the live news until stop(): params() gives the question (cursors etc.; null: not now),
     onNews(body, params) draws an answer (and drops one to params the page has moved on from).
     One request streams many answers (GET /api/v1/live/stream, server-sent events: the server moves
     the cursors on as it answers, at most one answer per gapMs, so the news of gapMs gather into one);
     when the page's params() differ from what the stream assumes (the page redrew, changed its axis,
     has runs to add), or after the stream's 10 s, the page asks again with its own params. */
  function live(params, onNews, gapMs) {
    let stopped = false, ctrl = null;
    const pause = (ms) => new Promise((r) => setTimeout(r, ms));
    (async () => {
      while (!stopped) {
        try {
          const p = params();
          if (!p) { await pause(500); continue; }
          ctrl = new AbortController();
          document.body.dataset.liveStreams = String(Number(document.body.dataset.liveStreams || 0) + 1);
          const r = await request("/api/v1/live/stream", Object.assign({ wait: 10, gap: (gapMs || 0) / 1000 }, p),
            ctrl.signal);
          const reader = r.body.getReader(), text = new TextDecoder();
          let buf = "", ask = p, same = true;
          while (same && !stopped) {
            const { value, done } = await reader.read();
            if (done) break;
            buf += text.decode(value, { stream: true });
            for (let end = buf.indexOf("\n\n"); end >= 0 && same && !stopped; end = buf.indexOf("\n\n")) {
              const event = buf.slice(0, end);
              buf = buf.slice(end + 2);
              if (!event.startsWith("data: ")) continue;
              const body = JSON.parse(event.slice(6));
              await onNews(body, p);
              document.body.dataset.livePolls = String(Number(document.body.dataset.livePolls || 0) + 1);
              ask = nextAsk(ask, body);
              same = sameAsk(params(), ask);
            }
          }
          ctrl.abort(); // the stream the page moved on from (or the one that ended)
        } catch (err) {
          if (stopped || (err && err.name === "AbortError")) continue;
          fail(err);
          await pause(2000);
        }
      }
    })();
    return { stop() { stopped = true; if (ctrl) ctrl.abort(); } };
  }

  return { el, api, status, plot, begin, end, ema, applySmoothing, applyLogY, wireControls, fmtCount, parseCount,
    fmtValue, fail, extendLine, thin, extendHeat, extendAlerts, redraw, live, painted, escHtml, memoryToken: null,
    pageData: (k) => document.getElementById("page").dataset[k] };
})();
