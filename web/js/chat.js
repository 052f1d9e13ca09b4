// One conversation: its messages, the run streaming into it, and what can be done to it.
//
// Durable by design: a run's events come over an EventSource on
// `GET /api/chat?conversation=&run=`. A dropped connection is resumed by the browser
// with `Last-Event-ID` (nothing missed, nothing twice). After a reload the page
// replays the active run from its first event into an empty live view, and hides
// the messages that run has already checkpointed (the JSON Lines export says which
// checkpoint, and so which run, added each message): the text shown is exactly the
// model's, however often the page is reloaded.
import { api, withToken } from "./api.js";
import { approvalPanel } from "./approvals.js";
import { Banners } from "./banners.js";
import { Branches, learnIds } from "./branches.js";
import { decisionLine } from "./elements.js";
import { TitleEditor } from "./rename.js";
import { ACTIVE, statusLabel } from "./status.js";
import { Transcript } from "./transcript.js";

// While a run streams, how often the page asks whether a worker still beats.
const WORKER_CHECK_MS = 1000;
// A worker whose process died is not alive to the API at once (Redis drops its beating
// connection: shared/liveness.py). One paused or cut off from Redis keeps beating nowhere: workers
// beat every 2 s, so a newest beat older than this has missed two, and its worker is gone.
const HEARTBEAT_STALE_MS = 5000;

/** Is the worker gone, by the heartbeat `GET /api/runs` reports? (Unknown: not gone.) */
function workerGone(worker) {
  if (!worker) return false;
  return !worker.alive || (worker.heartbeatAgeMs ?? 0) > HEARTBEAT_STALE_MS;
}

export class ChatView {
  constructor({ sidebar, onConversation }) {
    this.sidebar = sidebar;
    this.onConversation = onConversation; // tells the router which conversation is shown
    this.banners = new Banners(document.getElementById("banners"));
    this.form = document.getElementById("composer");
    this.input = document.getElementById("message");
    this.sendButton = document.getElementById("send");
    this.stopButton = document.getElementById("stop");
    this.resumeButton = document.getElementById("resume");
    this.connection = document.getElementById("connection");
    this.bar = document.getElementById("conversation-bar");
    this.status = document.getElementById("conversation-status");
    this.exportMd = document.getElementById("export-md");
    this.exportJsonl = document.getElementById("export-jsonl");
    this.deleteButton = document.getElementById("delete");
    this.view = document.getElementById("chat-view");
    this.notFound = document.getElementById("not-found");
    this.runActions = document.getElementById("run-actions");

    this.conversation = null;
    this.run = null; // the run being streamed
    this.source = null;
    this.lastEventId = 0;
    this.generation = 0; // bumps on every open(): late answers of an old view are dropped
    this.branches = new Branches(this);
    this.transcript = new Transcript(this.branches);
    this.titleEditor = new TitleEditor(this);

    this.form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.send();
    });
    this.input.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        this.send();
      }
    });
    this.stopButton.addEventListener("click", () => this.stop());
    this.resumeButton.addEventListener("click", () => this.resume());
    this.deleteButton.addEventListener("click", () => this.remove());
    document.addEventListener("keydown", (event) => {
      // Esc stops the answer, as Stop does (not while a dialog or another view is in front).
      if (event.key !== "Escape" || event.isComposing || event.defaultPrevented) return;
      if (this.stopButton.hidden || this.view.hidden || document.querySelector("dialog[open]")) return;
      event.preventDefault();
      this.stop();
    });
  }

  // --- showing a conversation ------------------------------------------------------

  reset() {
    this.detach();
    this.generation += 1;
    this.banners.clear();
    this.titleEditor.cancel();
    this.transcript.clear();
    this.pending = null; // the requests of the last `approval` event of the stream
    this.panel = null;
    this.goneBanner = null;
    this.reopen = false; // read the conversation again when the run ends (a fork, a switch)
    this.notice = null; // a banner that outlives that reading (what a fork left behind)
    this.resumeButton.hidden = true;
    this.setActive(false);
    this.showNotFound(null);
  }

  /** Instead of the chat, say that conversation `id` does not exist (null: show the chat). */
  showNotFound(id) {
    const missing = id !== null;
    this.notFound.hidden = !missing;
    for (const part of [this.transcript.messages, this.runActions, this.form]) part.hidden = missing;
    if (missing) {
      this.bar.hidden = true;
      document.getElementById("not-found-id").textContent = id;
    }
  }

  /** Show conversation `id` (null: a new chat). */
  async open(id) {
    this.reset();
    this.conversation = id;
    const generation = this.generation;
    this.bar.hidden = !id;
    if (!id) {
      this.input.focus();
      return;
    }
    this.setHeader({ id, title: "…", status: "" });
    try {
      // The run first, then the thread: a run that ends in between is then replayed
      // whole (its messages hidden below), never left out.
      const runs = await api(`/api/runs?conversation=${encodeURIComponent(id)}&limit=1`);
      const latest = runs.runs[0];
      const active = latest && ACTIVE.has(latest.status) ? latest.id : null;
      const detail = await api(`/api/conversations/${encodeURIComponent(id)}`);
      const hidden = active ? await this.messagesOfRun(id, active) : new Set();
      if (generation !== this.generation) return;
      this.setHeader(detail.conversation);
      this.transcript.renderHistory(detail.messages.filter((m) => m.role === "user" || !hidden.has(m.id)));
      if (active) this.attach(active, 0, latest.status);
      else this.showOutcome(detail.conversation, detail.resumable, detail.pendingApproval, detail.resumePlan);
    } catch (error) {
      if (generation !== this.generation) return;
      if (error.status === 404) this.showNotFound(id);
      else this.banners.show(error);
    }
  }

  /** Ids of the messages that checkpoints of `run` added to the thread. */
  async messagesOfRun(conversation, run) {
    const text = await api(`/api/conversations/${encodeURIComponent(conversation)}/export?format=jsonl`, { text: true });
    const ids = new Set();
    for (const line of text.split("\n")) {
      if (!line.trim()) continue;
      const checkpoint = JSON.parse(line);
      if (checkpoint.run_id === run) for (const message of checkpoint.messages) ids.add(message.id);
    }
    return ids;
  }

  setHeader(conversation) {
    this.titleEditor.show(conversation.title);
    this.setStatus(conversation.status);
    const base = `/api/conversations/${encodeURIComponent(conversation.id)}/export`;
    this.exportMd.href = withToken(base);
    this.exportJsonl.href = withToken(`${base}?format=jsonl`);
    this.bar.hidden = false;
  }

  setStatus(status) {
    this.status.textContent = status ? statusLabel(status) : "";
    this.status.className = `status status-${status || "none"}`;
  }

  showOutcome(conversation, resumable, pendingApproval, plan) {
    const error = conversation.error;
    if (error && ["failed", "interrupted"].includes(conversation.status)) {
      this.banners.show(error, { kind: "error" });
    } else if (conversation.status === "cancelled") {
      this.transcript.note("Stopped.");
    } else if (conversation.status === "waiting" && pendingApproval) {
      this.showApprovals(pendingApproval);
    }
    this.resumeButton.hidden = !resumable;
    this.transcript.showPlan(resumable ? plan : null);
  }

  // --- the stream ------------------------------------------------------------------

  setActive(active) {
    this.stopButton.hidden = !active;
    this.sendButton.disabled = active;
    // The API refuses (409) to delete a conversation whose run is queued or running.
    this.deleteButton.disabled = active;
    this.transcript.messages.classList.toggle("running", active); // no edit, regenerate or switch meanwhile
    this.deleteButton.title = active ? "Stop the answer first (Stop or Esc) to delete this conversation" : "";
    if (active) this.resumeButton.hidden = true;
  }

  /** Stream `run` after event `after` (0: from its start); `status`: the run's, as last known. */
  attach(run, after, status = "running") {
    const missed = after ? this.missed : false; // a reconnect keeps what it learnt
    this.detach();
    this.missed = missed;
    this.run = run;
    this.lastEventId = after;
    this.setActive(true);
    this.setStatus(status);
    const params = new URLSearchParams({ conversation: this.conversation, run });
    if (after) params.set("lastEventId", String(after));
    const source = new EventSource(withToken(`/api/chat?${params}`));
    this.source = source;
    const on = (type, handle) =>
      source.addEventListener(type, (event) => {
        if (source !== this.source) return;
        const id = Number(event.lastEventId);
        // Ids are strictly increasing per run: an event already shown is never shown twice.
        if (id && id <= this.lastEventId) return;
        if (id) this.lastEventId = id;
        if (type === "token" || type === "trace") this.setStatus("running");
        handle(JSON.parse(event.data));
      });
    on("token", (text) => {
      this.workerBack();
      this.transcript.appendToken(text);
    });
    on("trace", (trace) => this.transcript.trace(trace));
    on("missed", () => {
      this.missed = true;
    });
    on("approval", (data) => {
      this.pending = data.requests;
    });
    on("end", (data) => this.ended(data));
    on("chat-error", (data) => this.failed(data));
    source.addEventListener("open", () => {
      if (source === this.source) this.connection.hidden = true;
    });
    this.watchWorker(run);
    source.addEventListener("error", () => {
      if (source !== this.source) return;
      if (source.readyState === EventSource.CLOSED) this.streamClosed(source);
      else this.connection.hidden = false; // the browser reconnects with Last-Event-ID
    });
  }

  detach() {
    if (this.source) this.source.close();
    this.source = null;
    clearTimeout(this.workerTimer);
    this.connection.hidden = true;
    this.missed = false;
  }

  /**
   * While `run` streams, ask every second whether a worker still beats. The stream alone
   * cannot tell: a worker killed mid-answer just stops sending, and its run is recorded
   * interrupted only when a worker is back.
   */
  watchWorker(run) {
    clearTimeout(this.workerTimer);
    this.workerTimer = setTimeout(async () => {
      if (run !== this.run || !this.source) return;
      try {
        const found = await api(`/api/runs?conversation=${encodeURIComponent(this.conversation)}&limit=1`);
        const info = found.runs[0];
        if (run === this.run && info && info.id === run && info.status === "running" && workerGone(found.worker)) {
          this.workerStopped(found.worker);
        }
      } catch {
        // Unreachable API: the stream's own reconnection says so.
      }
      if (run === this.run && this.source) this.watchWorker(run);
    }, WORKER_CHECK_MS);
  }

  /** No worker beats for the running run: say so, and mark the partial answer interrupted. */
  workerStopped(worker) {
    if (this.goneBanner) return;
    const age = worker.heartbeatAgeMs;
    const ago = age !== undefined ? ` (its last heartbeat was ${Math.round(age / 1000)} s ago)` : "";
    this.goneBanner = this.banners.show({
      code: "WORKER_GONE",
      message: `The worker writing this answer stopped${ago}. The answer is interrupted; `
        + "Resume finishes it once a worker is back.",
    });
    // The answer stays open: should tokens come after all, they go on in the same bubble.
    this.transcript.interruptAnswer();
    this.setStatus("interrupted");
  }

  /** Tokens came after all (the heartbeat was only late): take the warning back. */
  workerBack() {
    if (!this.goneBanner) return;
    this.goneBanner.remove();
    this.goneBanner = null;
    this.transcript.uninterruptAnswer();
  }

  /** The browser gave up on the stream (an HTTP error, or 204: the run had ended). */
  async streamClosed(source) {
    const run = this.run;
    const generation = this.generation;
    let info;
    try {
      info = await api(`/api/runs/${encodeURIComponent(run)}`);
    } catch (error) {
      if (generation !== this.generation) return;
      this.banners.show(error);
      info = null;
    }
    if (generation !== this.generation || source !== this.source) return;
    if (info === null || ACTIVE.has(info.status)) {
      // Still going (or we cannot tell): reconnect after the last event shown.
      this.connection.hidden = false;
      setTimeout(() => {
        if (source === this.source) this.attach(run, this.lastEventId);
      }, 1000);
    } else {
      this.open(this.conversation);
    }
  }

  async finish() {
    const conversation = this.conversation;
    const generation = this.generation;
    const missed = this.missed;
    this.detach();
    this.run = null;
    this.setActive(false);
    this.transcript.closeSegment();
    this.sidebar.refresh();
    if (missed || this.reopen) {
      // Some events were no longer kept, or the thread forked or switched branches: the
      // checkpoint has the whole story, and the branches it has now.
      const notice = this.notice;
      await this.open(conversation);
      if (notice && conversation === this.conversation) this.banners.show(notice, { kind: "info" });
      return;
    }
    try {
      const detail = await api(`/api/conversations/${encodeURIComponent(conversation)}`);
      if (generation !== this.generation) return;
      this.setHeader(detail.conversation);
      this.transcript.settleCuts(detail.messages);
      learnIds(this.transcript.messages, detail.messages); // what Edit and Regenerate name
      this.resumeButton.hidden = !detail.resumable;
      this.transcript.showPlan(detail.resumable ? detail.resumePlan : null);
    } catch (error) {
      if (generation === this.generation) this.banners.show(error);
    }
  }

  ended(data) {
    if (data.status === "cancelled") this.transcript.cutAnswer("stopped");
    this.transcript.closeSegment();
    this.setStatus(data.status); // at once; the conversation read in finish() confirms it
    if (data.status === "cancelled") this.transcript.note("Stopped.");
    else if (data.status === "waiting" && this.pending) this.showApprovals(this.pending);
    this.finish();
  }

  failed(data) {
    // Whatever failed the run (a crash, the model), its step is not in the thread.
    this.transcript.cutAnswer("interrupted");
    if (this.goneBanner) this.goneBanner.remove();
    this.goneBanner = null;
    this.banners.show({ code: data.code, message: data.message });
    this.finish();
  }

  // --- approvals -------------------------------------------------------------------

  /** The calls the conversation waits on, each with Approve, Reject and Edit. */
  showApprovals(requests) {
    if (this.panel) this.panel.remove();
    this.transcript.closeSegment();
    for (const request of requests) {
      const card = this.transcript.card(request.id);
      if (card) card.state.textContent = "waiting for your decision";
    }
    this.panel = this.transcript.place(approvalPanel(requests, (decisions) => this.decide(decisions)));
    this.panel.querySelector("input")?.focus({ preventScroll: true });
  }

  async decide(decisions) {
    const conversation = this.conversation;
    this.banners.clear();
    let accepted;
    try {
      accepted = await api("/api/chat", { method: "POST", body: { conversation, decisions } });
    } catch (error) {
      this.banners.show(error);
      if (error.code === "NO_APPROVAL_PENDING") await this.open(conversation); // decided elsewhere
      return;
    }
    if (this.panel) this.panel.remove();
    this.panel = null;
    this.pending = null;
    for (const decision of decisions) {
      const card = this.transcript.card(decision.id);
      if (card) decisionLine(card, decision);
    }
    this.transcript.dropInterrupted();
    this.attach(accepted.run, 0, "queued");
    this.sidebar.refresh();
  }

  // --- actions ---------------------------------------------------------------------

  async send() {
    const text = this.input.value;
    if (!text.trim() || this.sendButton.disabled) return;
    const conversation = this.conversation;
    this.banners.clear();
    this.sendButton.disabled = true;
    let accepted;
    try {
      accepted = await api("/api/chat", {
        method: "POST",
        body: conversation ? { message: text, conversation } : { message: text },
      });
    } catch (error) {
      this.sendButton.disabled = false;
      if (error.code === "SESSION_IN_PROGRESS" && conversation) {
        // Someone else (another tab, the CLI) is running it: show that run.
        await this.open(conversation);
      }
      this.banners.show(error);
      return;
    }
    this.input.value = "";
    this.transcript.dropInterrupted(); // not in the thread the new message continues
    if (!conversation) {
      this.conversation = accepted.conversation;
      this.onConversation(accepted.conversation);
      this.setHeader({ id: accepted.conversation, title: text.trim().split("\n")[0].slice(0, 80), status: "queued" });
    }
    this.resumeButton.hidden = true;
    this.transcript.appendUser(text);
    this.attach(accepted.run, 0, "queued");
    this.sidebar.refresh();
  }

  /** Follow `run`, accepted for an edit, a regenerate or a switch; read the conversation again after. */
  follow(run) {
    this.resumeButton.hidden = true;
    this.transcript.dropInterrupted();
    this.attach(run, 0, "queued");
    this.reopen = true;
    this.sidebar.refresh();
  }

  async stop() {
    if (!this.run) return;
    this.stopButton.disabled = true;
    try {
      await api(`/api/runs/${encodeURIComponent(this.run)}/cancel`, { method: "POST" });
      this.setStatus("cancelled");
    } catch (error) {
      this.banners.show(error);
    } finally {
      this.stopButton.disabled = false;
    }
  }

  async resume() {
    const conversation = this.conversation;
    this.banners.clear();
    this.resumeButton.disabled = true;
    try {
      const accepted = await api("/api/chat", { method: "POST", body: { resume: true, conversation } });
      this.resumeButton.hidden = true;
      this.banners.clear();
      this.transcript.showPlan(null);
      this.transcript.dropInterrupted();
      this.attach(accepted.run, 0, "queued");
      this.sidebar.refresh();
    } catch (error) {
      this.banners.show(error);
    } finally {
      this.resumeButton.disabled = false;
    }
  }

  async remove() {
    const conversation = this.conversation;
    if (!conversation || !window.confirm("Delete this conversation? This cannot be undone.")) return;
    try {
      await api(`/api/conversations/${encodeURIComponent(conversation)}`, { method: "DELETE" });
      this.sidebar.refresh();
      location.hash = "#/";
    } catch (error) {
      this.banners.show(error);
    }
  }
}
