// For operators: queued, running and recently finished runs, and whether a worker is
// alive; refreshed every 2 s while shown. A run names its conversation by the title the
// sidebar lists (GET /api/runs carries only the id), else by the id's first 8 characters.
import { api, ApiError } from "./api.js";
import { Banners } from "./banners.js";
import { when } from "./sidebar.js";
import { statusBadge } from "./status.js";

const REFRESH_MS = 2000;

function seconds(ms) {
  if (ms === undefined || ms === null) return "";
  return ms < 10000 ? `${(ms / 1000).toFixed(1)} s` : `${Math.round(ms / 1000)} s`;
}

/** Whose run it is, and who else started or cancelled it (the runs' `owner`, `startedBy`, `cancelledBy`). */
function who(run) {
  const parts = [run.owner || ""];
  if (run.startedBy && run.startedBy !== run.owner) parts.push(`started by ${run.startedBy}`);
  if (run.cancelledBy) parts.push(`cancelled by ${run.cancelledBy}`);
  return parts.filter(Boolean).join(", ");
}

function cell(text, className) {
  const td = document.createElement("td");
  if (className) td.className = className;
  if (text instanceof Node) td.append(text);
  else td.textContent = text ?? "";
  return td;
}

// A finished run's breakdown: where its time went (GET /api/runs/{id} `breakdown`), one
// labelled part each; the rest of its duration is the worker's own work.
const PARTS = [["queuedMs", "queued"], ["modelMs", "model"], ["toolsMs", "tools"], ["databaseMs", "database"]];

function breakdown(run) {
  const span = document.createElement("span");
  if (!run.breakdown) return span;
  for (const [field, name] of PARTS) {
    if (run.breakdown[field] === undefined) continue;
    const part = document.createElement("span");
    part.className = "part";
    part.dataset.part = name;
    const ms = run.breakdown[field];
    part.textContent = `${name} ${ms < 1000 ? `${ms} ms` : seconds(ms)}`;
    span.append(part);
  }
  return span;
}

function conversationLink(id, title) {
  const a = document.createElement("a");
  a.href = `#/c/${id}`;
  a.className = "conversation";
  a.textContent = title || id.slice(0, 8);
  a.title = id;
  return a;
}

export class RunsView {
  /** `titleOf(id)`: the title of conversation `id` as the page knows it, or undefined. */
  constructor({ titleOf }) {
    this.titleOf = titleOf;
    this.banners = new Banners(document.getElementById("runs-banners"));
    this.timer = null;
    this.shown = false;
  }

  start() {
    this.shown = true;
    this.tick();
  }

  stop() {
    this.shown = false;
    clearTimeout(this.timer);
  }

  async tick() {
    clearTimeout(this.timer);
    await this.refresh();
    if (this.shown) this.timer = setTimeout(() => this.tick(), REFRESH_MS);
  }

  async refresh() {
    const [runs, ready] = await Promise.allSettled([api("/api/runs?limit=100"), api("/api/readyz")]);
    this.banners.clear();
    if (runs.status === "fulfilled") this.renderRuns(runs.value);
    else this.banners.show(runs.reason);
    this.renderReadiness(ready);
    document.getElementById("runs-updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
  }

  renderReadiness(ready) {
    const p = document.getElementById("readiness");
    if (ready.status === "fulfilled") {
      p.textContent = "Ready: Redis, the database, a worker and the model are there.";
      p.className = "ok";
      this.renderWorker(ready.value.worker);
      return;
    }
    const error = ready.reason;
    p.className = "bad";
    p.textContent = error instanceof ApiError ? `Not ready: ${error.message}` : String(error.message || error);
    if (error.body && error.body.worker) this.renderWorker(error.body.worker);
  }

  renderWorker(worker) {
    const p = document.getElementById("worker-state");
    if (!worker) {
      p.textContent = "Worker: unknown (Redis cannot be asked)";
      p.className = "worker bad";
      return;
    }
    const beat = worker.heartbeatAgeMs !== undefined ? `, last heartbeat ${seconds(worker.heartbeatAgeMs)} ago` : "";
    if (worker.alive) {
      p.textContent = `Worker: alive (pid ${worker.pid ?? "?"}, since ${worker.startedAt ? when(worker.startedAt) : "?"}${beat})`;
      p.className = "worker ok";
    } else {
      p.textContent = `Worker: none alive${beat}`;
      p.className = "worker bad";
    }
    p.dataset.alive = String(Boolean(worker.alive));
  }

  cancelButton(run) {
    const button = document.createElement("button");
    button.type = "button";
    button.className = "danger";
    button.textContent = run.cancelRequested ? "Stopping…" : "Cancel";
    button.disabled = Boolean(run.cancelRequested);
    button.setAttribute("aria-label", `Cancel run ${run.id}`);
    button.addEventListener("click", async () => {
      button.disabled = true;
      try {
        await api(`/api/runs/${encodeURIComponent(run.id)}/cancel`, { method: "POST" });
      } catch (error) {
        this.banners.show(error);
      }
      this.tick();
    });
    return button;
  }

  renderRuns(data) {
    if (data.worker) this.renderWorker(data.worker);
    const queued = data.runs.filter((r) => r.status === "queued").sort((a, b) => a.position - b.position);
    const running = data.runs.filter((r) => r.status === "running");
    const finished = data.runs.filter((r) => !["queued", "running"].includes(r.status)).slice(0, 20);
    this.fill("runs-queued", queued, (r) => [
      cell(String((r.position ?? 0) + 1), "position"),
      cell(seconds(r.waitedMs), "waited"),
      cell(conversationLink(r.conversation, this.titleOf(r.conversation))),
      cell(r.kind),
      cell(who(r), "who"),
      cell(this.cancelButton(r)),
    ], "No run is waiting.");
    this.fill("runs-running", running, (r) => [
      cell(r.node || "starting", "node"),
      cell(String(r.stepCount ?? 0), "step"),
      cell(seconds(r.elapsedMs), "elapsed"),
      cell(conversationLink(r.conversation, this.titleOf(r.conversation))),
      cell(who(r), "who"),
      cell(this.cancelButton(r)),
    ], "Nothing is running.");
    this.fill("runs-finished", finished, (r) => {
      const outcome = statusBadge(r.status);
      if (r.error) {
        outcome.textContent += ` (${r.error.code})`;
        outcome.title = r.error.message;
      }
      return [
        cell(outcome, "outcome"),
        cell(seconds(r.durationMs)),
        cell(breakdown(r), "breakdown"),
        cell(String(r.stepCount ?? 0)),
        cell(r.finishedAt ? when(r.finishedAt) : ""),
        cell(conversationLink(r.conversation, this.titleOf(r.conversation))),
        cell(who(r), "who"),
      ];
    }, "No run has finished yet.");
  }

  fill(tableId, runs, cells, emptyText) {
    const body = document.querySelector(`#${tableId} tbody`);
    body.replaceChildren();
    if (!runs.length) {
      const tr = document.createElement("tr");
      const td = cell(emptyText, "empty");
      td.colSpan = document.querySelectorAll(`#${tableId} thead th`).length;
      tr.append(td);
      body.append(tr);
      return;
    }
    for (const run of runs) {
      const tr = document.createElement("tr");
      tr.dataset.run = run.id;
      tr.dataset.status = run.status;
      tr.append(...cells(run));
      body.append(tr);
    }
  }
}
