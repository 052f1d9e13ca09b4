// Branches in the page: Edit on the user's messages, Regenerate on answers, and a `‹ 2/3 ›`
// switcher on the message where the thread forks (its `branch` in the conversation's detail).
//
// Each is a run the view follows like any other: an edit or a regenerate is
// `POST /api/chat {conversation, message, replaces}` / `{conversation, regenerate}`, a switch
// `POST /api/conversations/{id}/branch {message}`. The branch a fork leaves is kept; the tool
// calls on it that may have acted on the world are named (`abandonedCalls`), as their effects
// stay. Once the run ends the view reads the conversation again, switchers included.
import { api } from "./api.js";
import { el } from "./elements.js";

/** `name {arguments}` of each call, for a sentence. */
function callsText(calls) {
  return calls.map((call) => `${call.name} ${JSON.stringify(call.arguments)}`).join("; ");
}

/** The user message a node of the message list answers (itself, for a user message). */
function askedBy(node) {
  for (let at = node; at; at = at.previousElementSibling) {
    if (at.classList.contains("user")) return at;
  }
  return null;
}

export class Branches {
  /** `view`: the ChatView whose conversation this acts on. */
  constructor(view) {
    this.view = view;
  }

  /** The actions of a user message: Edit, and the switcher when the thread forks before it. */
  userActions(node, text, branch) {
    const edit = el("button", { type: "button", class: "branch-action edit", title: "Edit this message and send it again", text: "Edit" });
    edit.addEventListener("click", () => this.openEditor(node, text));
    const parts = [edit];
    if (branch && branch.count > 1) parts.push(this.switcher(branch));
    return parts;
  }

  /** Regenerate, on an answer: another answer to the user message before it. */
  regenerateButton(node) {
    const button = el("button", { type: "button", class: "branch-action regenerate", title: "Answer this message again", text: "Regenerate" });
    button.addEventListener("click", () => this.regenerate(node));
    return button;
  }

  /** `‹ 2/3 ›`: the branch shown among those from this fork point, and the way to the others. */
  switcher(branch) {
    const index = branch.index;
    const previous = el("button", { type: "button", class: "branch-prev", "aria-label": "Previous branch", text: "‹", disabled: index <= 1 });
    const next = el("button", { type: "button", class: "branch-next", "aria-label": "Next branch", text: "›", disabled: index >= branch.count });
    previous.addEventListener("click", () => this.switchTo(branch.alternatives[index - 2].message));
    next.addEventListener("click", () => this.switchTo(branch.alternatives[index].message));
    const label = el("span", { class: "branch-position", text: `${index}/${branch.count}` });
    const switcher = el("span", { class: "branch-switcher", role: "group", "aria-label": `Branch ${index} of ${branch.count}` }, previous, label, next);
    // Calls made on the other branches that may have acted: switching does not undo them.
    const acted = branch.alternatives.flatMap((alternative, i) => (i + 1 === index ? [] : alternative.actingCalls));
    if (acted.length) {
      switcher.append(el("span", { class: "branch-acted", title: callsText(acted), text: `${acted.length} tool call${acted.length > 1 ? "s" : ""} on other branches acted` }));
    }
    return switcher;
  }

  /** Turn the message into a box to edit it in: Send forks the thread before it. */
  openEditor(node, text) {
    if (node.querySelector(".editor")) return;
    const bubble = node.querySelector(".bubble");
    const box = el("textarea", { class: "editor-text", rows: 3, "aria-label": "Edited message" });
    box.value = text;
    const send = el("button", { type: "submit", class: "primary", text: "Send" });
    const cancel = el("button", { type: "button", text: "Cancel" });
    const editor = el("form", { class: "editor" }, box, el("div", { class: "editor-actions" }, cancel, send));
    const close = () => {
      editor.remove();
      bubble.hidden = false;
    };
    cancel.addEventListener("click", close);
    editor.addEventListener("submit", async (event) => {
      event.preventDefault();
      if (!box.value.trim() || !node.dataset.id) return; // no id yet: the button is hidden until then
      send.disabled = true;
      if (await this.fork(node, { message: box.value, replaces: node.dataset.id }, box.value)) close();
      else send.disabled = false;
    });
    box.addEventListener("keydown", (event) => {
      if (event.key === "Escape") {
        event.preventDefault(); // not the page's Esc (Stop)
        close();
      } else if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        editor.requestSubmit();
      }
    });
    bubble.hidden = true;
    bubble.after(editor);
    box.focus();
  }

  async regenerate(node) {
    const user = askedBy(node);
    if (!user || !user.dataset.id) return;
    await this.fork(user, { regenerate: user.dataset.id }, user.querySelector(".bubble").textContent);
  }

  /** Post the edit or regenerate; on acceptance the view shows the new branch from `node` on. */
  async fork(node, body, text) {
    const view = this.view;
    view.banners.clear();
    let accepted;
    try {
      accepted = await api("/api/chat", { method: "POST", body: { conversation: view.conversation, ...body } });
    } catch (error) {
      view.banners.show(error);
      return false;
    }
    if (accepted.abandonedCalls?.length) {
      view.notice = {
        code: "EFFECTS_STAY",
        message: `The branch you left made tool calls that may have acted; their effects stay: ${callsText(accepted.abandonedCalls)}`,
      };
      view.banners.show(view.notice, { kind: "info" });
    }
    // The old branch is kept on the server; here the view goes on from the fork.
    while (node.nextElementSibling) node.nextElementSibling.remove();
    node.remove();
    view.transcript.appendUser(text);
    view.follow(accepted.run);
    return true;
  }

  async switchTo(message) {
    const view = this.view;
    view.banners.clear();
    try {
      const accepted = await api(`/api/conversations/${encodeURIComponent(view.conversation)}/branch`, { method: "POST", body: { message } });
      view.follow(accepted.run);
    } catch (error) {
      view.banners.show(error);
    }
  }
}

/** Give the user messages shown the ids the conversation's detail has for them (in order). */
export function learnIds(container, messages) {
  const nodes = container.querySelectorAll(".message.user");
  const users = messages.filter((m) => m.role === "user");
  if (nodes.length !== users.length) return;
  nodes.forEach((node, i) => {
    node.dataset.id = users[i].id;
  });
}
