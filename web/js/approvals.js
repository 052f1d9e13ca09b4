// The tool calls a conversation waits on: one card per call with Approve, Reject (with a
// reason) and Edit arguments, and one button that sends every decision at once
// (`POST /api/chat {conversation, decisions}`; the API wants exactly one per call).
// Names and arguments come from the model: they are set as text, never as markup.
import { cardSection, el } from "./elements.js";

let panels = 0; // ids for labels, unique in the page

// Always JSON (a string too, quoted), unlike a tool card's text: Edit parses it back as the
// call's arguments.
function asJson(value) {
  try {
    return JSON.stringify(value ?? {}, null, 2);
  } catch {
    return String(value);
  }
}

/** One request's card; `.decision()` gives its decision, or throws an Error naming the problem. */
function requestCard(request, index) {
  const id = `approval-${panels}-${index}`;
  const group = `${id}-action`;
  const choice = (value, label) => {
    const input = el("input", { type: "radio", name: group, value, id: `${id}-${value}` });
    return { input, node: el("label", { for: `${id}-${value}`, class: "choice" }, input, ` ${label}`) };
  };
  const approve = choice("approve", "Approve");
  const reject = choice("reject", "Reject");
  const edit = choice("edit", "Edit arguments");
  const reason = el("input", { type: "text", id: `${id}-reason`, class: "reason", placeholder: "optional" });
  const reasonRow = el("div", { class: "approval-field", hidden: true },
    el("label", { for: `${id}-reason`, text: "Reason (the model is told)" }), reason);
  const args = el("textarea", { id: `${id}-arguments`, class: "arguments", rows: "4", spellcheck: "false" });
  args.value = asJson(request.arguments);
  const argsRow = el("div", { class: "approval-field", hidden: true },
    el("label", { for: `${id}-arguments`, text: "Arguments (JSON object)" }), args);
  const problem = el("p", { class: "error-text", role: "alert" });

  // A call whose answer never came (the worker stopped, the call timed out, the tool's server
  // went away): it may have acted already.
  const uncertain = request.kind === "uncertain";
  const note = uncertain
    ? el("p", { class: "uncertain-note", text:
      "This call may already have run: its answer never came (the worker stopped, or the tool did not answer). "
      + "Approve sends it again (with the same idempotency key), Reject never sends it." })
    : null;
  if (uncertain) approve.node.lastChild.textContent = " Send again";
  const card = el(
    "fieldset",
    { class: uncertain ? "approval uncertain" : "approval", "data-call": request.id },
    el("legend", {}, "Tool ", el("code", { class: "tool-name", text: request.name })),
    ...(note ? [note] : []),
    ...cardSection(uncertain ? "Arguments" : "Proposed arguments", "tool-args", asJson(request.arguments)),
    el("div", { class: "choices", role: "radiogroup", "aria-label": `Decision on ${request.name}` },
      approve.node, reject.node, edit.node),
    reasonRow,
    argsRow,
    problem,
  );
  for (const { input } of [approve, reject, edit]) {
    input.addEventListener("change", () => {
      reasonRow.hidden = !reject.input.checked;
      argsRow.hidden = !edit.input.checked;
      problem.textContent = "";
    });
  }

  card.decision = () => {
    problem.textContent = "";
    const fail = (text) => {
      problem.textContent = text;
      throw new Error(`${request.name}: ${text}`);
    };
    if (approve.input.checked) return { id: request.id, action: "approve" };
    if (reject.input.checked) {
      const message = reason.value.trim();
      return message ? { id: request.id, action: "reject", message } : { id: request.id, action: "reject" };
    }
    if (edit.input.checked) {
      let parsed;
      try {
        parsed = JSON.parse(args.value);
      } catch (error) {
        fail(`the arguments are not valid JSON (${error.message})`);
      }
      if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) {
        fail("the arguments must be a JSON object, like {\"key\": \"value\"}");
      }
      return { id: request.id, action: "edit", arguments: parsed };
    }
    return fail("choose Approve, Reject or Edit arguments");
  };
  return card;
}

/**
 * The panel for `requests`; `send(decisions)` posts them and resolves once accepted
 * (it rejects with the API's error, which the caller shows).
 */
export function approvalPanel(requests, send) {
  panels += 1;
  const cards = requests.map(requestCard);
  const submit = el("button", { type: "submit", class: "primary", text: "Send decisions" });
  const form = el(
    "form",
    { class: "approvals", "aria-label": "Tool calls waiting for your decision" },
    el("p", { class: "approvals-title", text: requests.every((r) => r.kind === "uncertain")
      ? "A tool call may already have run. It is not sent again until you decide."
      : requests.length === 1
        ? "The agent wants to run a tool. Nothing runs until you decide."
        : `The agent wants to run ${requests.length} tools. Nothing runs until you decide on each.` }),
    ...cards,
    el("div", { class: "approvals-actions" }, submit),
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    let decisions;
    try {
      decisions = cards.map((card) => card.decision());
    } catch {
      form.querySelector(".error-text:not(:empty)")?.scrollIntoView({ block: "center" });
      return;
    }
    submit.disabled = true;
    try {
      await send(decisions);
    } finally {
      submit.disabled = false;
    }
  });
  return form;
}
