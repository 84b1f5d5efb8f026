/* Runs page: the extra columns (any config key, flattened with dots; the loss summaries the service
   sends with ?summary=loss,val_loss), how a cell reads and sorts, and the filter expression.
   Used by runs.js; user strings are only ever written with textContent. */
"use strict";

const HWRuns = (() => {
  const STORE_KEY = "hyperwatch.runs.columns";
  const SUMMARY_NAMES = ["loss", "val_loss"];
  const SUMMARY = [
    { id: "summary.loss.last", label: "last loss", metric: "loss", stat: "last", by: true },
    { id: "summary.loss.min", label: "min loss", metric: "loss", stat: "min", by: true },
    { id: "summary.loss.min_step", label: "step of min loss", metric: "loss", stat: "min_step", by: true },
    { id: "summary.val_loss.last", label: "last val_loss", metric: "val_loss", stat: "last", by: true },
    { id: "summary.val_loss.min", label: "min val_loss", metric: "val_loss", stat: "min" },
    { id: "summary.val_loss.min_step", label: "step of min val_loss", metric: "val_loss", stat: "min_step" },
  ];
  /* The run's own fields a filter may name (the table's fixed columns). */
  const FIELDS = {
    name: "name", project: "project", group: "group", status: "status", depth: "depth",
    params: "total_params", total_params: "total_params", tokens: "tokens", last_step: "last_step",
    alerts: "alerts", tags: "tags",
  };
  const NONFINITE = { NaN: NaN, Infinity: Infinity, "-Infinity": -Infinity };
  const MISSING = { kind: "missing", text: "—" };

  /* {"optim": {"arm": "x"}, "lr": 1} -> {"optim.arm": "x", "lr": 1}; lists stay whole. */
  function flatten(obj, prefix = "", out = {}) {
    for (const [k, v] of Object.entries(obj || {})) {
      const key = prefix ? `${prefix}.${k}` : k;
      if (v && typeof v === "object" && !Array.isArray(v)) flatten(v, key, out);
      else out[key] = v;
    }
    return out;
  }

  function fmtNonFinite(v) {
    if (Number.isNaN(v)) return "NaN";
    return v > 0 ? "+Inf" : "-Inf";
  }

  /* A measured number in 5 significant digits (the full value is the cell's title). */
  function fmtMeasure(v) {
    if (Number.isInteger(v) && Math.abs(v) < 1e6) return String(v);
    const a = Math.abs(v);
    const s = a !== 0 && (a < 1e-3 || a >= 1e6) ? v.toExponential(4) : v.toPrecision(5);
    return s.replace(/\.?0+(e|$)/, "$1");
  }

  /* A raw value (config entry, summary number, run field) as a cell: kind num|text|nonfinite|missing. */
  function cell(v, measured) {
    if (v === undefined || v === null || v === "") return MISSING;
    if (typeof v === "string" && v in NONFINITE) v = NONFINITE[v];
    if (typeof v === "number") {
      if (!Number.isFinite(v)) return { kind: "nonfinite", num: v, text: fmtNonFinite(v) };
      return { kind: "num", num: v, text: measured ? fmtMeasure(v) : String(v), full: String(v) };
    }
    if (typeof v === "boolean") return { kind: "text", text: String(v) };
    if (Array.isArray(v) || typeof v === "object") return { kind: "text", text: JSON.stringify(v) };
    return { kind: "text", text: String(v) };
  }

  function summaryOf(run, col) {
    const m = (run.metrics || {})[col.metric];
    return m ? m[col.stat] : undefined;
  }

  /* The cell of column id ``id`` for ``run`` (``extra``: the run's flattened config, alert count). */
  function cellOf(run, id, extra) {
    if (id.startsWith("config.")) return cell(extra.config[id.slice(7)], false);
    const s = SUMMARY.find((c) => c.id === id);
    if (s) return cell(summaryOf(run, s), s.stat !== "min_step");
    if (id === "alerts") return cell(extra.alerts || 0, false);
    if (id === "tags") return cell((run.tags || []).join(" "), false);
    if (id === "updated_at") return cell(extra.updated, false);
    return cell(run[id], false);
  }

  /* Sort rank: numbers, then text (each way the user sorts), then +Inf, -Inf, NaN, then missing. */
  function compare(a, b, dir) {
    const cls = (c) => (c.kind === "num" ? 0 : c.kind === "text" ? 1 : c.kind === "nonfinite" ? 2 : 3);
    const ca = cls(a), cb = cls(b);
    if (ca !== cb) return ca - cb;
    if (ca === 0) return a.num === b.num ? 0 : (a.num < b.num ? -1 : 1) * dir;
    if (ca === 1) return a.text === b.text ? 0 : (a.text < b.text ? -1 : 1) * dir;
    if (ca === 2) {
      const r = (c) => (Number.isNaN(c.num) ? 2 : c.num > 0 ? 0 : 1);
      return r(a) - r(b);
    }
    return 0;
  }

  /* -- the column choice: URL (?col=...) over localStorage over the defaults ------------------------- */
  function stored() {
    try { return JSON.parse(localStorage.getItem(STORE_KEY) || "null"); } catch (e) { return null; }
  }

  /* {ids, explicit}: explicit when the user chose (the URL or an earlier choice on this browser). */
  function initialChoice(query) {
    const fromUrl = query.getAll("col");
    if (fromUrl.length) return { ids: fromUrl.filter((c) => c !== "none"), explicit: true };
    const kept = stored();
    if (Array.isArray(kept)) return { ids: kept.filter((c) => typeof c === "string"), explicit: true };
    return { ids: SUMMARY.filter((c) => c.by).map((c) => c.id), explicit: false };
  }

  function remember(ids) {
    try { localStorage.setItem(STORE_KEY, JSON.stringify(ids)); } catch (e) { /* private mode: URL only */ }
  }

  /* The page's URL with its state: ``state`` {col: [...], q, archived, sort, desc}. */
  function writeUrl(state) {
    const q = new URLSearchParams(location.search);
    for (const k of Object.keys(state)) q.delete(k);
    for (const [k, v] of Object.entries(state)) {
      if (Array.isArray(v)) (v.length ? v : ["none"]).forEach((x) => q.append(k, x));
      else if (v !== null && v !== undefined && v !== "" && v !== false) q.set(k, v === true ? "1" : v);
    }
    const text = q.toString();
    history.replaceState(null, "", location.pathname + (text ? "?" + text : ""));
  }

  function label(id) {
    const s = SUMMARY.find((c) => c.id === id);
    return s ? s.label : id.startsWith("config.") ? id.slice(7) : id;
  }

  /* -- the filter expression: clauses joined by "," (or "&&" / " and "), each KEY OP VALUE ---------- */
  const OPS = [">=", "<=", "!=", "==", "=", ">", "<", "~"];
  const NUMBER = /^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/;
  const SPECIAL = { nan: NaN, inf: Infinity, "+inf": Infinity, "-inf": -Infinity, infinity: Infinity,
    "+infinity": Infinity, "-infinity": -Infinity };

  function numberOf(text) {
    const t = text.toLowerCase();
    if (t in SPECIAL) return SPECIAL[t];
    return NUMBER.test(text) ? Number(text) : null;
  }

  /* Which column a filter's key names: a run field, a summary (loss.min or summary.loss.min), a config
     key (lr or config.lr); null when none. */
  function resolve(key, configKeys) {
    if (key in FIELDS) return FIELDS[key];
    const s = SUMMARY.find((c) => c.id === key || c.id === "summary." + key);
    if (s) return s.id;
    const bare = key.startsWith("config.") && configKeys.has(key.slice(7)) ? key.slice(7) : key;
    return configKeys.has(bare) ? "config." + bare : null;
  }

  function listed(keys, most = 12) {
    return keys.slice(0, most).join(", ") + (keys.length > most ? ` and ${keys.length - most} more` : "");
  }

  /* Parse ``text`` into clauses {id, op, text, num}; throws Error saying what is wrong and how to write it. */
  function parseFilter(text, configKeys) {
    const clauses = [];
    for (const raw of text.split(/,|&&|\s+and\s+/i)) {
      const part = raw.trim();
      if (!part) continue;
      const m = /^([^<>=!~\s]+)\s*(>=|<=|!=|==|=|>|<|~)\s*(.*)$/.exec(part);
      if (!m) {
        throw new Error(`"${part}": write KEY OP VALUE with OP one of ${OPS.join(" ")} (e.g. lr>1e-3, optim.arm=hyperp)`);
      }
      const [, key, op, rawValue] = m;
      const value = rawValue.trim().replace(/^(["'])(.*)\1$/, "$2");
      if (!value) throw new Error(`"${part}": nothing after ${op}; give a value (e.g. ${key}${op}1)`);
      const id = resolve(key, configKeys);
      if (id === null) {
        const summaries = SUMMARY.map((c) => c.id.slice(8));
        throw new Error(`"${part}": no column "${key}"; config keys here: ${listed([...configKeys].sort()) || "none"}; `
          + `summaries: ${summaries.join(", ")}; run fields: ${Object.keys(FIELDS).join(", ")}`);
      }
      const num = numberOf(value);
      if ((op[0] === ">" || op[0] === "<") && (num === null || Number.isNaN(num))) {
        throw new Error(`"${part}": ${op} compares numbers; "${value}" is not one (e.g. ${key}${op}1e-3)`);
      }
      clauses.push({ id, op: op === "==" ? "=" : op, text: value, num });
    }
    return clauses;
  }

  function equal(c, clause) {
    if (c.kind === "missing") return false;
    if (clause.num !== null && (c.kind === "num" || c.kind === "nonfinite")) {
      return Number.isNaN(clause.num) ? Number.isNaN(c.num) : c.num === clause.num;
    }
    return c.text === clause.text;
  }

  /* Does a row (a function id -> cell) pass every clause? */
  function passes(cellFor, clauses) {
    return clauses.every((cl) => {
      const c = cellFor(cl.id);
      switch (cl.op) {
        case "=": return equal(c, cl);
        case "!=": return !equal(c, cl);
        case "~": return c.kind !== "missing" && c.text.toLowerCase().includes(cl.text.toLowerCase());
        default: {
          if (c.kind !== "num" && c.kind !== "nonfinite") return false;
          const x = c.num, y = cl.num;
          return cl.op === ">" ? x > y : cl.op === ">=" ? x >= y : cl.op === "<" ? x < y : x <= y;
        }
      }
    });
  }

  return {
    SUMMARY, SUMMARY_NAMES, flatten, cellOf, compare, initialChoice, remember, writeUrl, label,
    parseFilter, passes,
  };
})();
