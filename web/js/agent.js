// The empty page (no conversation yet) says who answers: the model and the tools the agent
// has, as the workers' heartbeat reports them (`GET /api/agent`). Read each time the empty
// page is shown, as a tool server that starts late adds its tools. Without an answer (Redis
// down, no worker ever seen) the panel stays hidden: the page works without it.
import { api } from "./api.js";
import { el } from "./elements.js";

export class AgentPanel {
  constructor() {
    this.panel = document.getElementById("agent");
    this.model = document.getElementById("agent-model");
    this.tools = document.getElementById("agent-tools");
    this.asked = 0;
  }

  async load() {
    this.asked += 1;
    const asked = this.asked;
    let info;
    try {
      info = await api("/api/agent");
    } catch {
      return; // left as it was: hidden, or what the last answer said
    }
    if (asked !== this.asked) return;
    this.model.textContent = info.model;
    this.tools.replaceChildren(
      ...info.tools.map((tool) => el("li", {}, el("code", { text: tool.name }), tool.description ? ` ${tool.description}` : null)),
    );
    if (!info.tools.length) this.tools.append(el("li", { class: "none", text: "none: the agent answers from the model alone" }));
    this.panel.hidden = false;
  }
}
