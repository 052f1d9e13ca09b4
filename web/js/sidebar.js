// The conversations, newest first, a page at a time (`limit`, then `cursor` = `nextCursor`),
// filtered as you type in the search box (`q`: titles containing it, case aside).
import { api } from "./api.js";
import { plainText } from "./markdown.js";
import { ACTIVE, statusBadge } from "./status.js";

const PAGE = 30;
// Typing pauses this long before the list is asked for again: one request per word, not per key.
const SEARCH_DELAY_MS = 150;
const relative = new Intl.RelativeTimeFormat(undefined, { numeric: "auto" });

export function when(iso) {
  const then = new Date(iso);
  if (Number.isNaN(then.getTime())) return "";
  const seconds = Math.round((then.getTime() - Date.now()) / 1000);
  const steps = [[60, "second"], [60, "minute"], [24, "hour"], [7, "day"]];
  let value = seconds;
  for (const [size, unit] of steps) {
    if (Math.abs(value) < size) return relative.format(value, unit);
    value = Math.round(value / size);
  }
  return then.toLocaleDateString();
}

export class Sidebar {
  constructor({ onError }) {
    this.list = document.getElementById("conversations");
    this.more = document.getElementById("more-conversations");
    this.search = document.getElementById("search");
    this.noMatch = document.getElementById("no-match");
    this.onError = onError;
    this.query = "";
    this.asked = 0; // bumps on every refresh: the answer to an older one is dropped
    this.current = null;
    this.titles = new Map(); // id -> title as shown, of every conversation listed so far
    this.shown = new Map(); // id -> the status the page knows better than the list (showStatus)
    this.cursor = null;
    this.pages = 1;
    this.more.addEventListener("click", () => this.loadMore());
    let timer = null;
    this.search.addEventListener("input", () => {
      clearTimeout(timer);
      timer = setTimeout(() => this.filter(this.search.value.trim()), SEARCH_DELAY_MS);
    });
  }

  /** Show only the conversations whose title contains `query` ("": all of them). */
  filter(query) {
    if (query === this.query) return;
    this.query = query;
    this.pages = 1;
    this.refresh();
  }

  async page(cursor) {
    const params = new URLSearchParams({ limit: String(PAGE) });
    if (cursor) params.set("cursor", cursor);
    if (this.query) params.set("q", this.query);
    const data = await api(`/api/conversations?${params}`);
    // Without paging on the server, the whole list comes at once and there is no cursor.
    return { conversations: data.conversations, next: data.nextCursor || null };
  }

  /** Reload the pages shown so far. */
  async refresh() {
    this.asked += 1;
    const asked = this.asked;
    try {
      let cursor = null;
      const items = [];
      for (let i = 0; i < this.pages; i += 1) {
        const { conversations, next } = await this.page(cursor);
        items.push(...conversations);
        cursor = next;
        if (!next) break;
      }
      if (asked !== this.asked) return;
      this.cursor = cursor;
      this.render(items, false);
    } catch (error) {
      this.onError(error);
    }
  }

  async loadMore() {
    if (!this.cursor) return;
    try {
      const { conversations, next } = await this.page(this.cursor);
      this.pages += 1;
      this.cursor = next;
      this.render(conversations, true);
    } catch (error) {
      this.onError(error);
    }
  }

  titleOf(conversation) {
    const title = plainText(conversation.title || "") || "New conversation";
    this.titles.set(conversation.id, title);
    return title;
  }

  /** The title shown for conversation `id`, if it was listed; else undefined. */
  title(id) {
    return this.titles.get(id);
  }

  render(conversations, append) {
    const seen = new Set(append ? [...this.list.children].map((li) => li.dataset.id) : []);
    if (!append) this.list.replaceChildren();
    for (const c of conversations) {
      if (seen.has(c.id)) continue;
      const li = document.createElement("li");
      li.dataset.id = c.id;
      const link = document.createElement("a");
      link.href = `#/c/${c.id}`;
      const title = document.createElement("span");
      title.className = "title";
      title.textContent = this.titleOf(c);
      const meta = document.createElement("span");
      meta.className = "meta";
      const time = document.createElement("time");
      time.dateTime = c.updatedAt;
      time.title = new Date(c.updatedAt).toLocaleString();
      time.textContent = when(c.updatedAt);
      const status = statusBadge((ACTIVE.has(c.status) && this.shown.get(c.id)) || c.status);
      status.dataset.listed = c.status;
      const count = document.createElement("span");
      count.className = "count";
      count.textContent = `${c.messageCount} msg`;
      meta.append(time, " · ", count, " ", status);
      link.append(title, meta);
      li.append(link);
      this.list.append(li);
    }
    this.more.hidden = !this.cursor;
    this.noMatch.hidden = !this.query || this.list.children.length > 0;
    this.highlight(this.current);
  }

  /**
   * Show conversation `id` as `status` while the list still has its run going (a worker gone:
   * worker.js); null: as the list says again.
   */
  showStatus(id, status) {
    if (status) this.shown.set(id, status);
    else this.shown.delete(id);
    const li = [...this.list.children].find((item) => item.dataset.id === id);
    const badge = li && li.querySelector(".status");
    if (!badge) return;
    const listed = badge.dataset.listed;
    const shown = statusBadge((ACTIVE.has(listed) && status) || listed);
    shown.dataset.listed = listed;
    badge.replaceWith(shown);
  }

  highlight(id) {
    this.current = id;
    for (const li of this.list.children) {
      const link = li.querySelector("a");
      if (li.dataset.id === id) link.setAttribute("aria-current", "page");
      else link.removeAttribute("aria-current");
    }
  }
}
