/* The forecast across scale: the scale page's panel (#forecast-panel) and, on a run page
   (#forecast-watch), a run at its group's largest size against the band its smaller runs forecast.
   Sentences come from the service (the API's words) and are written with textContent. */
"use strict";

(() => {
  const INDICATORS = ["attention_z", "router_z", "attention_rms", "mlp_rms", "attention_outlier_ratio",
    "mlp_outlier_ratio", "max_vio"];
  const SUFFIX = { "": 1, k: 1e3, m: 1e6, b: 1e9, t: 1e12 };

  /* "7e9", "1.3B", "300M", "157K" -> a number; null when it is not a positive size. */
  function parseSize(text) {
    const m = /^\s*([0-9.]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMbBtT]?)\s*$/.exec(text || "");
    const v = m ? parseFloat(m[1]) * SUFFIX[m[2].toLowerCase()] : NaN;
    return v > 0 && isFinite(v) ? v : null;
  }

  function field(text, input) {
    return HW.el("label", {}, text, input);
  }

  function groupPanel(box, groupId) {
    const name = HW.el("select", { id: "fc-name" }, ...INDICATORS.map((n) => HW.el("option", { value: n, text: n })));
    const target = HW.el("input", { id: "fc-target", autocomplete: "off", size: 18, placeholder: "10x the largest run" });
    const axis = HW.el("select", { id: "fc-axis" }, HW.el("option", { value: "params", text: "parameters" }),
      HW.el("option", { value: "flops", text: "training FLOPs" }));
    const form = HW.el("form", { class: "controls", id: "fc-form" }, field("indicator", name),
      field("target size", target), field("in", axis), HW.el("button", { type: "submit", text: "Forecast" }));
    const sentence = HW.el("b", { id: "fc-sentence" });
    const final = HW.el("p", { id: "fc-final", class: "sub" });
    const watched = HW.el("ul", { id: "fc-watched" });
    const fig = HW.el("div", { class: "fig", id: "fc-figure" });
    box.replaceChildren(HW.el("h2", { text: "Forecast at a larger size" }), form,
      HW.el("p", {}, sentence), fig, final, watched);

    async function draw() {
      HW.begin();
      try {
        const query = { name: name.value, axis: axis.value };
        const text = target.value.trim();
        if (text) {
          const size = parseSize(text);
          if (size === null) throw new Error(`target size: ${JSON.stringify(text)} is not a size; write 7e9, 1.3B or 300M`);
          query.target = size;
        }
        const body = await HW.api(`/ui/data/groups/${groupId}/forecast`, query);
        if (!text && body.target) target.placeholder = `${HW.fmtCount(body.target)} (10x largest)`;
        sentence.textContent = body.sentence;
        final.textContent = body.final || "";
        watched.replaceChildren(...(body.watched || []).map((s) => HW.el("li", { text: s })));
        await HW.plot(fig, body.figure);
      } catch (err) {
        HW.fail(err);
      } finally {
        HW.end();
      }
    }

    form.addEventListener("submit", (ev) => { ev.preventDefault(); draw(); });
    name.addEventListener("change", draw);
    axis.addEventListener("change", () => { target.value = ""; draw(); });
    draw();
  }

  async function runSection(box, runId) {
    HW.begin();
    try {
      const body = await HW.api(`/ui/data/runs/${runId}/forecast`);
      if (!body.watched || !body.indicators.length) return; // not the group's largest run: nothing to show
      const pick = HW.el("select", { id: "fw-name" },
        ...body.indicators.map((i) => HW.el("option", { value: i.name, text: i.name })));
      const fig = HW.el("div", { class: "fig", id: "fw-figure" });
      const list = HW.el("ul", { id: "fw-sentences" }, ...body.indicators.map((i) => HW.el("li", { text: i.sentence })));
      box.replaceChildren(HW.el("h2", { text: "Against the forecast of its group's smaller runs" }), list,
        HW.el("div", { class: "controls" }, field("indicator", pick)), fig);
      box.hidden = false;
      const draw = () => HW.plot(fig, body.indicators.find((i) => i.name === pick.value).figure);
      pick.addEventListener("change", () => draw().catch(HW.fail));
      await draw();
    } catch (err) {
      HW.fail(err);
    } finally {
      HW.end();
    }
  }

  document.addEventListener("DOMContentLoaded", () => {
    const panel = document.getElementById("forecast-panel");
    if (panel) groupPanel(panel, HW.pageData("groupId"));
    const watch = document.getElementById("forecast-watch");
    if (watch) runSection(watch, HW.pageData("runId"));
  });
})();
