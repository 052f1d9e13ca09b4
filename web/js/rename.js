// Renaming the conversation shown, from its header: Rename turns the title into a field;
// Enter saves (`PATCH /api/conversations/{id} {title}`), Esc cancels. The worker writes the
// title: 200 once it has, 202 while it is busy with a run (the title shown is the new one
// either way). A refused title (blank, too long) keeps the field open with the API's message.
import { api } from "./api.js";
import { plainText } from "./markdown.js";

export class TitleEditor {
  /** `view`: the ChatView whose conversation this renames. */
  constructor(view) {
    this.view = view;
    this.heading = document.getElementById("conversation-title");
    this.button = document.getElementById("rename");
    this.input = document.getElementById("title-input");
    this.stored = ""; // the title as the API has it (the heading shows it without Markdown)
    this.saving = false;
    this.button.addEventListener("click", () => this.edit());
    this.input.addEventListener("keydown", (event) => {
      if (event.isComposing) return;
      if (event.key === "Enter") {
        event.preventDefault();
        this.save();
      } else if (event.key === "Escape") {
        event.preventDefault(); // Esc here cancels the edit, it does not stop an answer
        this.cancel();
      }
    });
  }

  /** The title the API gave the conversation shown. */
  show(title) {
    this.stored = title || "";
    this.heading.textContent = plainText(this.stored) || "Conversation";
  }

  edit() {
    this.input.value = this.stored;
    this.heading.hidden = true;
    this.button.hidden = true;
    this.input.hidden = false;
    this.input.focus();
    this.input.select();
  }

  cancel() {
    this.input.hidden = true;
    this.heading.hidden = false;
    this.button.hidden = false;
  }

  async save() {
    const id = this.view.conversation;
    if (!id || this.saving) return;
    this.saving = true;
    try {
      const renamed = await api(`/api/conversations/${encodeURIComponent(id)}`, {
        method: "PATCH", body: { title: this.input.value },
      });
      if (this.view.conversation !== id) return; // another conversation opened meanwhile
      this.show(renamed.title);
      this.cancel();
      this.view.sidebar.refresh();
    } catch (error) {
      this.view.banners.show(error);
      this.input.focus();
    } finally {
      this.saving = false;
    }
  }
}
