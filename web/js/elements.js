// The parts a conversation's view is built of: elements, Copy buttons, highlighted code blocks,
// tool cards and the decisions shown under them. No state of their own: transcript.js,
// branches.js and approvals.js place them.
import { highlightCode } from "./markdown.js";

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children) if (child !== null && child !== undefined) node.append(child);
  return node;
}

export function pretty(value) {
  if (typeof value === "string") return value;
  try {
    return JSON.stringify(value, null, 2);
  } catch {
    return String(value);
  }
}

export async function toClipboard(text) {
  if (navigator.clipboard && window.isSecureContext) {
    await navigator.clipboard.writeText(text);
    return;
  }
  // Served over plain http to another host, the Clipboard API is missing: the older way
  // still works within a click.
  const area = el("textarea", { class: "visually-hidden", readonly: true });
  area.value = text;
  document.body.append(area);
  area.select();
  const copied = document.execCommand("copy");
  area.remove();
  if (!copied) throw new Error("the browser refused to copy");
}

/** A Copy button for `text()`; it says "Copied" (or why not) for a moment after a click. */
export function copyButton(title, text) {
  const button = el("button", { type: "button", class: "copy", title, "aria-live": "polite", text: "Copy" });
  let timer = null;
  button.addEventListener("click", async () => {
    try {
      await toClipboard(text());
      button.textContent = "Copied";
    } catch {
      button.textContent = "Copy failed";
    }
    clearTimeout(timer);
    timer = setTimeout(() => {
      button.textContent = "Copy";
    }, 2000);
  });
  return button;
}

/** Highlighted code blocks, each with a bar naming its language and a Copy button for its text. */
export function decorateCode(body) {
  for (const pre of body.querySelectorAll("pre")) {
    const code = pre.querySelector("code") || pre;
    const language = el("span", { class: "code-language" });
    const head = el("div", { class: "code-head" }, language, copyButton("Copy this code", () => code.textContent));
    const block = el("div", { class: "code-block" });
    pre.replaceWith(block);
    block.append(head, pre);
    highlightCode(code).then(
      (name) => {
        language.textContent = name;
      },
      (error) => console.warn("code is shown plain: highlight.js did not load", error),
    );
  }
}

/** A card's titled block: "Arguments" or "Result", then the value as text in a `<pre>`. */
export function cardSection(title, className, text) {
  return [el("div", { class: "tool-section-title", text: title }), el("pre", { class: className, text })];
}

/** A tool call and, once it comes, its result, as a collapsible card. */
export function toolCard(name, args, callId) {
  const state = el("span", { class: "tool-state", text: "running…" });
  const card = el(
    "details",
    { class: "tool", "data-call": callId || null },
    el("summary", {}, el("span", { class: "tool-label", text: "Tool " }), el("code", { class: "tool-name", text: name }), " ", state),
    ...cardSection("Arguments", "tool-args", pretty(args ?? {})),
  );
  card.state = state;
  return card;
}

export function setResult(card, result, status) {
  let pre = card.querySelector(".tool-result");
  if (!pre) {
    const [title, block] = cardSection("Result", "tool-result", "");
    card.append(title, block);
    pre = block;
  }
  pre.textContent = pretty(result);
  card.resultStatus = status;
  showState(card);
}

/**
 * The card's state in its summary, seen folded: what the user decided about the call (when it
 * needed a decision) and how it went. A rejected call is answered with an error for the
 * model's sake; it did not fail. Shown again whichever of the two comes last.
 */
function showState(card) {
  const decided = card.decided ? DECIDED[card.decided] || card.decided : "";
  if (card.resultStatus === undefined) {
    if (decided) card.state.textContent = decided;
    return;
  }
  const rejected = card.decided === "reject";
  const failed = card.resultStatus === "error" && !rejected;
  card.classList.toggle("tool-error", failed);
  if (rejected) card.state.textContent = DECIDED.reject;
  else if (failed) card.state.textContent = decided ? `${decided}, then failed` : "error";
  else card.state.textContent = "done";
}

export const DECIDED = { approve: "approved by you", reject: "rejected by you", edit: "edited by you before it ran" };

// What a resume will do with a call of the turn it continues (`resumePlan` in the detail;
// the CLI's words, sophos_cli/commands.py PLAN_WORDS).
export const PLANNED = {
  answer: "answered from the ledger (it finished; not sent again)",
  send: "sent (it was never sent)",
  resend: "sent again with its key (it may have run; safe to repeat)",
  task: "answered from its task on the tool's server (asked about only if the server forgot it)",
  ask: "asked about first (it may already have run)",
};

/** The line under a tool card saying what a resume will do with its call (`action`). */
export function planLine(card, action) {
  // In the summary, so it shows with the card folded.
  const summary = card.querySelector("summary");
  const line = card.querySelector(".plan") || summary.appendChild(el("span", { class: `plan plan-${action}` }));
  line.textContent = ` · on resume: ${PLANNED[action] || action}`;
  line.dataset.action = action;
}

/** Under a call that needed approval: what the user decided (once, live or read back). */
export function decisionLine(card, approval) {
  const reason = approval.action === "reject" && approval.message ? `: ${approval.message}` : "";
  const text = `Decision: ${DECIDED[approval.action] || approval.action}${reason}`;
  card.decided = approval.action;
  const line = card.querySelector(".decision") || card.appendChild(el("div", { class: "tool-section-title decision" }));
  line.textContent = text;
  showState(card);
}
