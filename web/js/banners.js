// Banners above a view: what went wrong (or what to know), with the API's own code and message,
// each dismissable. The chat view and the runs view each have their container.
import { ApiError } from "./api.js";
import { el } from "./elements.js";

/** Banners with the API's own code and message. */
export class Banners {
  constructor(container) {
    this.container = container;
  }

  show(error, { kind = "error", actions = [] } = {}) {
    const code = error instanceof ApiError || error.code ? error.code : "";
    const message = error.message || String(error);
    const closeButton = el("button", { type: "button", class: "icon", "aria-label": "Dismiss", text: "×" });
    const banner = el(
      "div",
      { class: `banner banner-${kind}`, role: kind === "error" ? "alert" : "status", "data-code": code || null },
      code ? el("strong", { class: "code", text: code }) : null,
      el("span", { class: "message", text: message }),
      ...actions,
      closeButton,
    );
    closeButton.addEventListener("click", () => banner.remove());
    this.container.append(banner);
    return banner;
  }

  clear() {
    this.container.replaceChildren();
  }
}
