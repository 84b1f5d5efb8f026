/* Alerts page: a timeline (click a point to open it on its run page) and a table, filtered by run and kind. */
"use strict";

(() => {
  const form = document.getElementById("filters");
  const tbody = document.querySelector("#alerts-table tbody");
  const timeline = document.getElementById("timeline");

  function link(a) {
    return `/runs/${a.run_id}?name=${encodeURIComponent(a.name)}&step=${a.step}`;
  }

  async function load() {
    const f = new FormData(form);
    const params = { run_id: f.get("run_id"), rule: f.get("rule"), project: f.get("project").trim() };
    HW.begin();
    try {
      const [alerts, fig] = await Promise.all([
        HW.api("/api/v1/alerts", { ...params, limit: 1000 }),
        HW.api("/ui/data/alerts", params),
      ]);
      tbody.replaceChildren(...alerts.map((a) => HW.el("tr", {},
        HW.el("td", { text: a.created_at.replace("T", " ").slice(0, 19) }),
        HW.el("td", {}, HW.el("a", { href: `/runs/${a.run_id}`, text: `${a.project}/${a.run}` })),
        HW.el("td", { text: a.rule }),
        HW.el("td", { text: a.source, title: a.source === "prometheus" ? "fired by Prometheus, delivered by Alertmanager" : "the service's own detector" }),
        HW.el("td", {}, HW.el("span", { class: `badge sev-${a.severity}`, text: a.severity })),
        HW.el("td", { text: a.layer === null ? a.name : `${a.name} (layer ${a.layer})` }),
        HW.el("td", {}, HW.el("a", { href: link(a), class: "point-link", text: String(a.step) })),
        HW.el("td", { class: "num", text: HW.fmtValue(a.value) }),
        HW.el("td", { text: a.message }))));
      HW.status(`${alerts.length} alerts`);
      await HW.plot(timeline, fig.figure);
      timeline.removeAllListeners?.("plotly_click");
      timeline.on("plotly_click", (ev) => {
        const p = ev.points && ev.points[0];
        if (!p || !p.customdata) return;
        const [runId, step, name] = p.customdata;
        location.href = link({ run_id: runId, step, name });
      });
    } catch (err) {
      HW.fail(err);
    } finally {
      HW.end();
    }
  }

  document.addEventListener("DOMContentLoaded", () => {
    const q = new URLSearchParams(location.search);
    for (const k of ["run_id", "rule", "project"]) if (q.get(k)) form.elements[k].value = q.get(k);
    form.addEventListener("submit", (ev) => { ev.preventDefault(); load(); });
    load();
  });
})();
