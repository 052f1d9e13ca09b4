// The run being shown, as it streams: an EventSource on `GET /api/chat?conversation=&run=`.
//
// A dropped connection is resumed by the browser with `Last-Event-ID` (nothing missed,
// nothing twice: event ids only grow within a run, and one already shown is skipped). When
// the browser gives up (an HTTP error, or 204: the run had ended) the run is asked for: still
// going, the stream reconnects after the last event shown; ended, the conversation is read again.
import { api, withToken } from "./api.js";
import { ACTIVE } from "./status.js";

export class RunStream {
  /** `view`: the ChatView that shows what streams. */
  constructor(view) {
    this.view = view;
    this.connection = document.getElementById("connection"); // "Reconnecting…"
    this.run = null; // the run being streamed
    this.source = null;
    this.lastEventId = 0;
    this.missed = false; // the stream said some events were no longer kept
  }

  /** Stream `run` after event `after` (0: from its start); `status`: the run's, as last known. */
  attach(run, after, status = "running") {
    const view = this.view;
    const missed = after ? this.missed : false; // a reconnect keeps what it learnt
    this.detach();
    this.missed = missed;
    this.run = run;
    this.lastEventId = after;
    view.setActive(true);
    view.setStatus(status);
    const params = new URLSearchParams({ conversation: view.conversation, run });
    if (after) params.set("lastEventId", String(after));
    const source = new EventSource(withToken(`/api/chat?${params}`));
    this.source = source;
    const on = (type, handle) =>
      source.addEventListener(type, (event) => {
        if (source !== this.source) return;
        const id = Number(event.lastEventId);
        // Ids are strictly increasing per run: an event already shown is never shown twice.
        if (id && id <= this.lastEventId) return;
        if (id) this.lastEventId = id;
        if (type === "token" || type === "trace") view.setStatus("running");
        handle(JSON.parse(event.data));
      });
    on("token", (text) => {
      view.worker.back();
      view.transcript.appendToken(text);
    });
    on("trace", (trace) => view.transcript.trace(trace));
    on("missed", () => {
      this.missed = true;
    });
    on("approval", (data) => {
      view.pending = data.requests;
    });
    on("end", (data) => view.ended(data));
    on("chat-error", (data) => view.failed(data));
    source.addEventListener("open", () => {
      if (source === this.source) this.connection.hidden = true;
    });
    view.worker.watch(run);
    source.addEventListener("error", () => {
      if (source !== this.source) return;
      if (source.readyState === EventSource.CLOSED) this.closed(source);
      else this.connection.hidden = false; // the browser reconnects with Last-Event-ID
    });
  }

  detach() {
    if (this.source) this.source.close();
    this.source = null;
    this.view.worker.stop();
    this.connection.hidden = true;
    this.missed = false;
  }

  /** The browser gave up on the stream (an HTTP error, or 204: the run had ended). */
  async closed(source) {
    const view = this.view;
    const run = this.run;
    const generation = view.generation;
    let info;
    try {
      info = await api(`/api/runs/${encodeURIComponent(run)}`);
    } catch (error) {
      if (generation !== view.generation) return;
      view.banners.show(error);
      info = null;
    }
    if (generation !== view.generation || source !== this.source) return;
    if (info === null || ACTIVE.has(info.status)) {
      // Still going (or we cannot tell): reconnect after the last event shown.
      this.connection.hidden = false;
      setTimeout(() => {
        if (source === this.source) this.attach(run, this.lastEventId);
      }, 1000);
    } else {
      view.open(view.conversation);
    }
  }
}
