// One conversation: opening it, its header, and what can be done to it (send, stop, resume,
// delete, decide on the calls it waits on). transcript.js draws its messages, stream.js follows
// its run, worker.js watches that run's worker; branches.js and rename.js act on it.
//
// After a reload the page replays the active run from its first event into an empty live
// view, and hides the messages that run has already checkpointed (the JSON Lines export says
// which checkpoint, and so which run, added each message): the text shown is exactly the
// model's, however often the page is reloaded.
import { api, withToken } from "./api.js";
import { approvalPanel } from "./approvals.js";
import { Banners } from "./banners.js";
import { Branches, learnIds } from "./branches.js";
import { decisionLine } from "./elements.js";
import { TitleEditor } from "./rename.js";
import { ACTIVE, statusLabel } from "./status.js";
import { RunStream } from "./stream.js";
import { Transcript } from "./transcript.js";
import { WorkerWatch } from "./worker.js";

export class ChatView {
  constructor({ sidebar, onConversation, assistant = () => null }) {
    this.sidebar = sidebar;
    this.assistant = assistant; // the assistant a new conversation is with (null: the default)
    this.onConversation = onConversation; // tells the router which conversation is shown
    this.banners = new Banners(document.getElementById("banners"));
    this.form = document.getElementById("composer");
    this.input = document.getElementById("message");
    this.sendButton = document.getElementById("send");
    this.stopButton = document.getElementById("stop");
    this.resumeButton = document.getElementById("resume");
    this.bar = document.getElementById("conversation-bar");
    this.status = document.getElementById("conversation-status");
    this.exportMd = document.getElementById("export-md");
    this.exportJsonl = document.getElementById("export-jsonl");
    this.deleteButton = document.getElementById("delete");
    this.view = document.getElementById("chat-view");
    this.notFound = document.getElementById("not-found");
    this.runActions = document.getElementById("run-actions");

    this.conversation = null;
    this.generation = 0; // bumps on every open(): late answers of an old view are dropped
    this.branches = new Branches(this);
    this.transcript = new Transcript(this.branches);
    this.stream = new RunStream(this);
    this.worker = new WorkerWatch(this);
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
    this.stream.detach();
    this.generation += 1;
    this.banners.clear();
    this.titleEditor.cancel();
    this.transcript.clear();
    this.pending = null; // the requests of the last `approval` event of the stream
    this.panel = null;
    this.worker.forget();
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
      if (active) this.stream.attach(active, 0, latest.status);
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

  // --- the run shown: going, then ended --------------------------------------------

  setActive(active) {
    this.stopButton.hidden = !active;
    this.sendButton.disabled = active;
    // The API refuses (409) to delete a conversation whose run is queued or running.
    this.deleteButton.disabled = active;
    this.transcript.messages.classList.toggle("running", active); // no edit, regenerate or switch meanwhile
    this.deleteButton.title = active ? "Stop the answer first (Stop or Esc) to delete this conversation" : "";
    if (active) this.resumeButton.hidden = true;
  }

  async finish() {
    const conversation = this.conversation;
    const generation = this.generation;
    const missed = this.stream.missed;
    this.stream.detach();
    this.stream.run = null;
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
      this.transcript.settleDecisions(detail.messages); // decided elsewhere too (another tab, the CLI)
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
    this.worker.dismiss();
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
    this.stream.attach(accepted.run, 0, "queued");
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
        body: conversation ? { message: text, conversation } : this.newConversation(text),
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
    this.stream.attach(accepted.run, 0, "queued");
    this.sidebar.refresh();
  }

  newConversation(message) {
    const assistant = this.assistant();
    return assistant ? { message, assistant } : { message };
  }

  /** Follow `run`, accepted for an edit, a regenerate or a switch; read the conversation again after. */
  follow(run) {
    this.resumeButton.hidden = true;
    this.transcript.dropInterrupted();
    this.stream.attach(run, 0, "queued");
    this.reopen = true;
    this.sidebar.refresh();
  }

  async stop() {
    if (!this.stream.run) return;
    this.stopButton.disabled = true;
    try {
      await api(`/api/runs/${encodeURIComponent(this.stream.run)}/cancel`, { method: "POST" });
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
      this.stream.attach(accepted.run, 0, "queued");
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
