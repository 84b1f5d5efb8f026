/* Run page: Archive / Unarchive and Delete (issue 35). The pages read with the read token only; a
   write asks for the write token (HYPERWATCH_WRITE_TOKEN) in its confirmation dialog and keeps it in
   this page's memory, never in storage. Delete also asks for the run's name, typed. */
"use strict";

(() => {
  const runId = document.getElementById("page").dataset.runId;
  const box = document.getElementById("run-actions");
  const dialog = document.getElementById("run-action-dialog");
  if (!box || !dialog || !runId) return;
  let run = null;
  let writeToken = null;

  function show() {
    box.hidden = false;
    document.getElementById("run-archive").textContent = run.archived ? "Unarchive" : "Archive";
    document.getElementById("run-archived-note").hidden = !run.archived;
  }

  async function write(method, body) {
    const headers = { Authorization: "Bearer " + writeToken };
    if (body) headers["Content-Type"] = "application/json";
    const r = await fetch(`/api/v1/runs/${runId}`, { method, headers, body: body ? JSON.stringify(body) : undefined });
    const out = await r.json().catch(() => null);
    if (!r.ok) {
      if (r.status === 401 || r.status === 403) writeToken = null;
      const detail = out && (out.message || out.detail);
      throw new Error(typeof detail === "string" ? detail : `${r.status} ${r.statusText}`);
    }
    return out;
  }

  /* Open the dialog for action ("archive", "unarchive", "delete"); resolves when it is closed. */
  function ask(action) {
    const form = dialog.querySelector("form");
    const name = document.getElementById("run-action-name");
    const token = document.getElementById("run-action-token");
    const error = document.getElementById("run-action-error");
    const deleting = action === "delete";
    document.getElementById("run-action-text").textContent = deleting
      ? `Delete run ${run.project}/${run.name} with all its points, alerts and incidents? This cannot be undone ` +
        "(Archive hides a run and keeps it). Type the run's name to delete it."
      : action === "archive"
        ? `Archive run ${run.project}/${run.name}? It is hidden from the runs list, its group's scale comparison ` +
          "and the alert lists, and kept whole; Unarchive brings it back."
        : `Unarchive run ${run.project}/${run.name}? It is listed and compared again.`;
    name.parentElement.hidden = !deleting;
    name.value = "";
    token.parentElement.hidden = !!writeToken;
    token.value = "";
    error.textContent = "";
    const confirm = document.getElementById("run-action-confirm");
    confirm.textContent = deleting ? "Delete" : action === "archive" ? "Archive" : "Unarchive";
    dialog.showModal();
    return new Promise((resolve) => {
      const submit = async (ev) => {
        ev.preventDefault();
        if (ev.submitter && ev.submitter.value === "cancel") { finish(); return; }
        if (deleting && name.value.trim() !== run.name) {
          error.textContent = `Type the run's name, ${run.name}, to delete it.`;
          return;
        }
        writeToken = writeToken || token.value.trim();
        try {
          if (deleting) await write("DELETE");
          else run = await write("PATCH", { archived: action === "archive" });
          finish(deleting ? "deleted" : "done");
        } catch (e) {
          error.textContent = e.message;
          token.parentElement.hidden = !!writeToken;
        }
      };
      let outcome;
      const finish = (result) => { outcome = result; dialog.close(); };
      dialog.addEventListener("close", () => { form.removeEventListener("submit", submit); resolve(outcome); },
        { once: true }); // Escape closes it too
      form.addEventListener("submit", submit);
    });
  }

  async function act(action) {
    if (dialog.open) return; // one dialog at a time: a click while one is open (its answer awaited) is ignored
    const result = await ask(action);
    if (result === "deleted") {
      HW.status(`Run ${run.project}/${run.name} deleted.`);
      location.assign("/runs");
    } else if (result === "done") {
      show();
      HW.status(run.archived ? "Archived: hidden from lists and scale comparisons." : "Unarchived.");
    }
  }

  document.getElementById("run-archive").addEventListener("click", () => act(run.archived ? "unarchive" : "archive"));
  document.getElementById("run-delete").addEventListener("click", () => act("delete"));
  HW.api(`/api/v1/runs/${runId}`).then((r) => { run = r; show(); }).catch(() => { /* run.js reports it */ });
})();
