// Which assistant a new conversation is with (docs/agent-protocol.md, "Assistants"): a small
// select on the empty page, shown only when the caller has assistants besides the default,
// `agent`. The conversation keeps the one it began with; the select says nothing of it after.
import { api } from "./api.js";
import { el } from "./elements.js";

const DEFAULT = "agent";

export class AssistantPicker {
  constructor() {
    this.row = document.getElementById("assistant-pick");
    this.select = document.getElementById("assistant");
    this.asked = 0;
  }

  async load() {
    this.asked += 1;
    const asked = this.asked;
    let found;
    try {
      found = await api("/assistants/search", { method: "POST", body: { limit: 100, sort_by: "name", sort_order: "asc" } });
    } catch {
      return; // left as it was: the default is what a new conversation gets
    }
    if (asked !== this.asked) return;
    const chosen = this.select.value;
    const others = found.filter((a) => a.graph_id === DEFAULT && a.metadata.created_by !== "system");
    this.select.replaceChildren(
      el("option", { value: "", text: "agent (the default)" }),
      ...others.map((a) => el("option", { value: a.assistant_id, text: a.name })),
    );
    if (others.some((a) => a.assistant_id === chosen)) this.select.value = chosen;
    this.row.hidden = others.length === 0;
  }

  /** The assistant a new conversation is to be with; null: the default. */
  chosen() {
    return this.row.hidden || !this.select.value ? null : this.select.value;
  }
}
