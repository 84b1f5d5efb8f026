/* Sweeps page: loss vs LR with the quadratic fits, transfer laws, scaling laws and leverage. */
"use strict";

(() => {
  const groupId = HW.pageData("groupId");
  const box = document.getElementById("figures");
  const baseline = document.getElementById("baseline");
  const ORDER = ["lr", "transfer_tokens", "transfer_depth", "transfer_batch_size", "scaling", "leverage"];

  async function draw() {
    HW.begin();
    try {
      const body = await HW.api(`/ui/data/groups/${groupId}/sweeps`, { baseline: baseline.value });
      const keep = baseline.value;
      baseline.replaceChildren(HW.el("option", { value: "", text: "none" }),
        ...body.methods.map((m) => HW.el("option", { value: m, text: m })));
      baseline.value = body.methods.includes(keep) ? keep : "";
      document.getElementById("notes").replaceChildren(
        ...body.notes.concat(body.skipped.map((s) => "skipped " + s)).map((n) => HW.el("li", { text: n })));
      const keys = ORDER.filter((k) => body.figures[k]);
      /* lay every box out first: a figure takes its width from its grid cell when drawn */
      box.replaceChildren(...keys.map((k) => HW.el("div", { class: "fig", id: "fig-" + k })));
      for (const key of keys) await HW.plot(document.getElementById("fig-" + key), body.figures[key]);
    } catch (err) {
      HW.fail(err);
    } finally {
      HW.end();
    }
  }

  async function header() {
    const g = await HW.api(`/api/v1/groups/${groupId}`);
    document.getElementById("group-title").textContent = `Sweeps · ${g.project}/${g.name}`;
    document.title = `${g.name} sweeps · HyperWatch`;
    document.getElementById("compare-link").setAttribute("href", `/groups/${groupId}`);
  }

  document.addEventListener("DOMContentLoaded", () => {
    const q = new URLSearchParams(location.search);
    if (q.get("baseline")) baseline.append(HW.el("option", { value: q.get("baseline"), text: q.get("baseline") }));
    baseline.value = q.get("baseline") || "";
    HW.begin();
    Promise.all([header(), draw()]).catch(HW.fail).finally(HW.end);
    baseline.addEventListener("change", draw);
  });
})();
