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

  /* GET JSON; asks for the read token on 401/403 and retries; errors carry the service's message. */
  async function api(path, params) {
    const url = new URL(path, location.origin);
    for (const [k, v] of Object.entries(params || {})) {
      if (Array.isArray(v)) v.forEach((x) => url.searchParams.append(k, x));
      else if (v !== null && v !== undefined && v !== "") url.searchParams.set(k, v);
    }
    for (let attempt = 0; attempt < 3; attempt++) {
      const t = HW.memoryToken || token();
      const headers = t ? { Authorization: "Bearer " + t } : {};
      const r = await fetch(url, { headers });
      if (r.status === 401 || r.status === 403) { await askToken(); continue; }
      const body = await r.json().catch(() => null);
      if (!r.ok) {
        const detail = body && (body.message || body.detail);
        throw new Error(typeof detail === "string" ? detail : `${r.status} ${r.statusText} for ${url.pathname}`);
      }
      return body;
    }
    throw new Error("the read token was refused three times");
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

  /* Draw a figure ({data, layout}) into div; keeps the raw y of smoothable traces for the EMA. */
  async function plot(div, fig) {
    div._raw = fig.data.map((t) => (t.meta && t.meta.smooth ? t.y.slice() : null));
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

  return { el, api, status, plot, begin, end, ema, applySmoothing, applyLogY, wireControls, fmtCount, parseCount,
    fmtValue, fail, memoryToken: null, pageData: (k) => document.getElementById("page").dataset[k] };
})();
