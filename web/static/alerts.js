/* Alerts page: a timeline of alert events (click a point to open it on its run page) and a table of
   incidents, one row per run, rule and episode, each expandable to its summary, layers, heads,
   steps and remedies. Filtered by run, kind and project. */
"use strict";

(() => {
  const form = document.getElementById("filters");
  const tbody = document.querySelector("#alerts-table tbody");
  const timeline = document.getElementById("timeline");

  function link(a) {
    return `/runs/${a.run_id}?name=${encodeURIComponent(a.name)}&step=${a.step}`;
  }

  function baseName(name) {
    return name.split(".")[0];
  }

  function list(label, items) {
    if (!items.length) return null;
    return HW.el("p", { class: "incident-list" }, HW.el("b", { text: `${label}: ` }), ...items);
  }

  function detail(inc) {
    const sep = (nodes) => nodes.flatMap((n, i) => (i ? [", ", n] : [n]));
    const steps = inc.steps.map((s) => HW.el("a", { href: link({ run_id: inc.run_id, name: baseName(inc.name), step: s }),
                                                    class: "step-link", text: String(s) }));
    const more = inc.events > inc.steps.length ? ` (${inc.events} events in all)` : "";
    return HW.el("td", { colspan: 11 },
      HW.el("p", { class: "incident-summary", text: inc.summary }),
      list("Layers", sep(inc.layers.map((l) => HW.el("span", { text: String(l) })))),
      list("Heads (layer.head)", sep(inc.heads.map((h) => HW.el("span", { text: `${h.layer}.${h.head}` })))),
      list("Steps", [...sep(steps), more]),
      list("Usual remedies", [HW.el("ul", {}, ...inc.remedies.map((r) => HW.el("li", { text: r })))]));
  }

  function toggle(button, inc) {
    const row = button.closest("tr");
    const open = button.getAttribute("aria-expanded") === "true";
    if (open) {
      row.nextElementSibling?.classList.contains("incident-detail") && row.nextElementSibling.remove();
    } else {
      row.after(HW.el("tr", { class: "incident-detail" }, detail(inc)));
    }
    button.setAttribute("aria-expanded", String(!open));
    button.textContent = open ? "▸" : "▾";
  }

  function incidentRow(inc, peaks) {
    const peak = peaks.get(`${inc.run_id}|${inc.name}`);
    const span = inc.first_step === inc.last_step ? String(inc.first_step) : `${inc.first_step} – ${inc.last_step}`;
    const where = inc.layers.length ? ` (layer${inc.layers.length > 1 ? "s" : ""} ${inc.layers.join(", ")})` : "";
    const expand = HW.el("button", { type: "button", class: "expand", "aria-expanded": "false",
                                     title: "layers, heads, steps and remedies", text: "▸" });
    expand.addEventListener("click", () => toggle(expand, inc));
    return HW.el("tr", { class: "incident" },
      HW.el("td", {}, expand, " ", inc.updated_at.replace("T", " ").slice(0, 19)),
      HW.el("td", {}, HW.el("a", { href: `/runs/${inc.run_id}`, text: `${inc.project}/${inc.run}` })),
      HW.el("td", { text: inc.rule }),
      HW.el("td", { text: inc.source, title: inc.source === "prometheus" ? "fired by Prometheus, delivered by Alertmanager" : "the service's own detector" }),
      HW.el("td", {}, HW.el("span", { class: `badge sev-${inc.severity}`, text: inc.severity })),
      HW.el("td", { text: `${baseName(inc.name)}${where}` }),
      HW.el("td", {}, HW.el("a", { href: inc.link, class: "point-link", text: span })),
      HW.el("td", { class: "num run-peak", text: peak === undefined ? "" : HW.fmtValue(peak),
                    title: "the largest value of the series over the whole run" }),
      HW.el("td", { class: "num event-peak", text: HW.fmtValue(inc.peak_value),
                    title: "the worst value among the incident's alert events" }),
      HW.el("td", { class: "num", text: String(inc.events) }),
      HW.el("td", { text: inc.message }));
  }

  async function load() {
    const f = new FormData(form);
    const params = { run_id: f.get("run_id"), rule: f.get("rule"), project: f.get("project").trim() };
    HW.begin();
    try {
      const [incidents, fig] = await Promise.all([
        HW.api("/api/v1/incidents", { ...params, limit: 1000 }),
        HW.api("/ui/data/alerts", params),
      ]);
      const peaks = new Map((fig.peaks || []).map((p) => [`${p.run_id}|${p.name}`, p.peak]));
      tbody.replaceChildren(...incidents.map((inc) => incidentRow(inc, peaks)));
      const events = incidents.reduce((n, i) => n + i.events, 0);
      HW.status(`${incidents.length} incidents (${events} alert events)`);
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
