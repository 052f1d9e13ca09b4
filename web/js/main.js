// The page's entry point: routes (#/, #/c/ID, #/runs) between the chat and the runs view.
import { Account } from "./account.js";
import { askForToken, keepToken } from "./api.js";
import { AgentPanel } from "./agent.js";
import { AssistantPicker } from "./assistants.js";
import { ChatView } from "./chat.js";
import { RunsView } from "./runs.js";
import { Sidebar } from "./sidebar.js";
import { completeSignIn } from "./signin.js";

// Back from the OIDC provider: its access token is this tab's key before anything is asked.
try {
  const accessToken = await completeSignIn();
  if (accessToken) keepToken(accessToken);
} catch (error) {
  askForToken(`Signing in through the provider failed (${error.message}).`);
}

const chatView = document.getElementById("chat-view");
const runsView = document.getElementById("runs-view");
const sidebarEl = document.getElementById("sidebar");
const menu = document.getElementById("menu");

const sidebar = new Sidebar({ onError: (error) => chat.banners.show(error) });
const picker = new AssistantPicker();
const chat = new ChatView({
  sidebar,
  assistant: () => picker.chosen(),
  onConversation: (id) => {
    // A new conversation got its id: name it in the address without reopening it.
    history.replaceState(null, "", `#/c/${id}`);
    sidebar.highlight(id);
  },
});
const runs = new RunsView({ titleOf: (id) => sidebar.title(id) });
const agent = new AgentPanel();
const account = new Account();

function route() {
  const hash = location.hash || "#/";
  sidebarEl.classList.remove("open");
  menu.setAttribute("aria-expanded", "false");
  if (hash === "#/runs") {
    chatView.hidden = true;
    runsView.hidden = false;
    document.title = "Runs · Sophos";
    runs.start();
    return;
  }
  runs.stop();
  runsView.hidden = true;
  chatView.hidden = false;
  document.title = "Sophos";
  const match = /^#\/c\/([0-9a-fA-F-]{36})$/.exec(hash);
  const id = match ? match[1].toLowerCase() : null;
  sidebar.highlight(id);
  if (id !== chat.conversation || id === null) chat.open(id);
  if (id === null) {
    agent.load(); // the empty page names who answers
    picker.load();
  }
}

document.getElementById("new-chat").addEventListener("click", () => {
  if (location.hash === "#/" || location.hash === "") {
    chat.open(null);
    agent.load();
    picker.load();
  } else {
    location.hash = "#/";
  }
});
menu.addEventListener("click", () => {
  const open = sidebarEl.classList.toggle("open");
  menu.setAttribute("aria-expanded", String(open));
});
window.addEventListener("hashchange", route);

account.load();
sidebar.refresh();
setInterval(() => {
  if (!document.hidden) sidebar.refresh();
}, 15000);
route();
// Everything above has run (the listeners are attached): what drives the page may begin.
document.documentElement.dataset.ready = "true";
