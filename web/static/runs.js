/* Runs page: filters (project, group, tags, status, depth, params), sortable columns, live status
   (refreshed every 10 s while "live" is ticked), alert badges, links to groups. */
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
    };
  }

  function value(r, key) {
    if (key === "alerts") return alertCounts[r.id] || 0;
    if (key === "tags") return (r.tags || []).join(" ");
    return r[key];
  }

  function render() {
    const f = filters();
    const shown = runs.filter((r) => (f.minDepth === null || (r.depth || 0) >= f.minDepth)
      && (f.maxDepth === null || (r.depth !== null && r.depth <= f.maxDepth))
      && (f.minParams === null || (r.total_params || 0) >= f.minParams));
    shown.sort((a, b) => {
      const x = value(a, sortKey), y = value(b, sortKey);
      if (x === y) return 0;
      if (x === null || x === undefined) return 1;
      if (y === null || y === undefined) return -1;
      return (x < y ? -1 : 1) * sortDir;
    });
    shownIds = shown.map((r) => r.id);
    tbody.replaceChildren(...shown.map((r) => {
      const n = alertCounts[r.id] || 0;
      return HW.el("tr", { "data-run-id": r.id },
        HW.el("td", {}, HW.el("a", { href: `/runs/${r.id}`, class: "run-name", text: r.name })),
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
      HW.api("/api/v1/runs", { project: f.project, group: f.group, status: f.status, tag: f.tag, limit: 1000 }),
      HW.api("/api/v1/alerts", { project: f.project, limit: 1000 }),
    ]);
    runs = found;
    alertCounts = {};
    for (const a of alerts) alertCounts[a.run_id] = (alertCounts[a.run_id] || 0) + 1;
    render();
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
    document.querySelectorAll("#runs-table th[data-key]").forEach((th) => th.addEventListener("click", () => {
      const key = th.dataset.key;
      sortDir = key === sortKey ? -sortDir : 1;
      sortKey = key;
      document.querySelectorAll("#runs-table th").forEach((h) => h.removeAttribute("aria-sort"));
      th.setAttribute("aria-sort", sortDir > 0 ? "ascending" : "descending");
      render();
    }));
    form.addEventListener("submit", (ev) => { ev.preventDefault(); load().catch(HW.fail); schedule(); });
    form.elements.live.addEventListener("change", schedule);
    document.getElementById("pick-all").addEventListener("change", (ev) => {
      for (const id of shownIds) { if (ev.target.checked) picked.add(id); else picked.delete(id); }
      render();
    });
    HW.begin();
    Promise.all([load(), groups()]).catch(HW.fail).finally(HW.end);
    schedule();
  });
})();
