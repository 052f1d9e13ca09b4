// The message list of the conversation shown: the user's messages, the answers (streamed token
// by token, rendered as Markdown once complete), the tool cards with their results, and the
// marks on answers cut short. It draws; the chat view decides what to draw and when.
import { copyButton, decisionLine, decorateCode, el, planLine, setResult, toolCard } from "./elements.js";
import { renderMarkdown } from "./markdown.js";

export class Transcript {
  /** `branches`: the Edit, switcher and Regenerate that user messages and answers carry. */
  constructor(branches) {
    this.branches = branches;
    this.messages = document.getElementById("messages");
    this.empty = document.getElementById("empty");
    this.segment = null; // the answer being written
    this.cards = new Map(); // tool call id -> its card
  }

  /** Nothing shown but the empty page. */
  clear() {
    this.messages.replaceChildren(this.empty);
    this.empty.hidden = false;
    this.segment = null;
    this.cards = new Map();
  }

  /** The card of tool call `id`, if shown. */
  card(id) {
    return this.cards.get(id);
  }

  renderHistory(messages) {
    for (const message of messages) {
      if (message.role === "user") this.appendUser(message.content, message);
      else if (message.role === "assistant") {
        if (message.content) {
          this.appendAssistant(message.content);
          if (message.status === "stopped") this.cutAnswer("stopped");
        }
        for (const call of message.toolCalls || []) {
          const card = this.appendCard(call.name, call.arguments, call.id);
          if (call.approval) decisionLine(card, call.approval);
        }
        this.closeSegment();
      } else if (message.role === "tool") {
        const card = this.cards.get(message.toolCallId) || this.appendCard(message.name || "tool", {}, message.toolCallId);
        setResult(card, message.content, message.status);
      }
    }
  }

  /** Each shown call's decision, as the thread records it (`messages`: the detail's). */
  settleDecisions(messages) {
    for (const message of messages) {
      for (const call of message.toolCalls || []) {
        const card = this.cards.get(call.id);
        if (card && call.approval) decisionLine(card, call.approval);
      }
    }
  }

  /** Under each call a resume continues, what it will do with it (none once nothing is to resume). */
  showPlan(plan) {
    for (const line of this.messages.querySelectorAll(".tool .plan")) line.remove();
    for (const planned of plan || []) {
      const card = this.cards.get(planned.id);
      if (card) planLine(card, planned.action);
    }
  }

  /** A step of the run as it streams: a new model turn, a tool call, a tool's result. */
  trace(trace) {
    const data = trace.data || {};
    if (trace.event === "enter" && trace.node === "agent") this.closeSegment();
    else if (trace.event === "call") this.appendCard(data.name || trace.name, data.arguments, data.tool_call_id);
    else if (trace.event === "result") {
      const card = this.cards.get(data.tool_call_id) || this.appendCard(data.name || trace.name, {}, data.tool_call_id);
      setResult(card, data.result, data.status);
    }
  }

  place(node) {
    this.empty.hidden = true;
    this.messages.append(node);
    node.scrollIntoView({ block: "end" });
    return node;
  }

  /** The answer being written is complete (a tool call, a new step, the end followed). */
  closeSegment() {
    const segment = this.segment;
    this.segment = null;
    if (!segment) return;
    segment.closed = true;
    segment.body.innerHTML = renderMarkdown(segment.text);
    decorateCode(segment.body);
    segment.node.classList.remove("streaming");
  }

  /**
   * The answer being written ends here, cut short: `why` is "interrupted" (the worker or the
   * model went away: the thread never got this text, a resume writes the answer again) or
   * "stopped" (the user's cut: the thread keeps it).
   */
  cutAnswer(why) {
    const segment = this.segment;
    this.closeSegment();
    if (segment && segment.text) this.markCut(segment, why);
  }

  /** Its worker stopped: the answer being written is interrupted, but stays open should tokens come after all. */
  interruptAnswer() {
    if (this.segment && this.segment.text) this.markCut(this.segment, "interrupted");
  }

  /** Tokens came after all: the answer being written is not interrupted. */
  uninterruptAnswer() {
    if (this.segment) this.unmarkInterrupted(this.segment.node);
  }

  markCut(segment, why) {
    const node = segment.node;
    node.answer = segment.text; // as far as it came
    node.classList.remove("streaming");
    if (node.classList.contains(why)) return;
    node.classList.add(why);
    node.querySelector(".message-actions").append(el("span", { class: `cut-label cut-${why}`, text: why }));
  }

  unmarkInterrupted(node) {
    node.classList.remove("interrupted");
    node.querySelector(".cut-interrupted")?.remove();
  }

  /**
   * Keep "interrupted" only on the partial answers the thread does not have (a worker killed
   * after its answer's checkpoint left it whole): those a resume writes again.
   */
  settleCuts(messages) {
    const kept = new Set(messages.filter((m) => m.role === "assistant").map((m) => m.content));
    for (const node of this.messages.querySelectorAll(".message.assistant.interrupted")) {
      if (kept.has(node.answer)) this.unmarkInterrupted(node);
    }
  }

  /** The partial answers a crash left, once a new run starts: it writes them again, whole. */
  dropInterrupted() {
    for (const node of this.messages.querySelectorAll(".message.assistant.interrupted")) node.remove();
  }

  /** A user message; `message`: as the detail has it (its id, and `branch` at a fork point). */
  appendUser(text, message = null) {
    this.closeSegment();
    const actions = el("div", { class: "message-actions" }, copyButton("Copy this message", () => text));
    const node = el("div", { class: "message user", "data-id": message?.id }, el("div", { class: "bubble", text }), actions);
    actions.append(...this.branches.userActions(node, text, message?.branch));
    return this.place(node);
  }

  appendAssistant(text) {
    this.closeSegment();
    const body = el("div", { class: "bubble markdown" });
    const segment = { body, text, scheduled: false, closed: false };
    // The answer's Markdown as the model wrote it, however far it has come.
    const actions = el("div", { class: "message-actions" }, copyButton("Copy this answer (Markdown)", () => segment.text));
    segment.node = this.place(el("div", { class: "message assistant" }, body, actions));
    actions.append(this.branches.regenerateButton(segment.node));
    this.segment = segment;
    const node = segment.node;
    body.innerHTML = renderMarkdown(text);
    return node;
  }

  appendToken(piece) {
    if (!this.segment) this.appendAssistant("");
    const segment = this.segment;
    segment.text += piece;
    segment.node.classList.add("streaming");
    if (!segment.scheduled) {
      // Re-rendering the whole answer per token is quadratic: once per frame is enough.
      segment.scheduled = true;
      setTimeout(() => {
        segment.scheduled = false;
        if (segment.closed) return; // closeSegment rendered it for good
        segment.body.innerHTML = renderMarkdown(segment.text);
        segment.node.scrollIntoView({ block: "end" });
      }, 16);
    }
  }

  appendCard(name, args, callId) {
    this.closeSegment();
    const card = toolCard(name, args, callId);
    this.place(card);
    if (callId) this.cards.set(callId, card);
    return card;
  }

  note(text) {
    return this.place(el("p", { class: "note", text }));
  }
}
