// Whether the worker writing the streamed run still beats. The stream alone cannot tell: a
// worker killed mid-answer just stops sending, and its run is recorded interrupted only when
// a worker is back. So while a run streams the page asks `GET /api/runs` every second, says
// so in a banner (WORKER_GONE) when no worker beats (the header and the sidebar say
// "interrupted", Stop goes), and takes it back if tokens come after all.
import { api } from "./api.js";

// While a run streams, how often the page asks whether a worker still beats.
const WORKER_CHECK_MS = 1000;
// A worker whose process died is not alive to the API at once (Redis drops its beating
// connection: shared/redis/liveness.py). One paused or cut off from Redis keeps beating nowhere: workers
// beat every 2 s, so a newest beat older than this has missed two, and its worker is gone.
const HEARTBEAT_STALE_MS = 5000;

/** Is the worker gone, by the heartbeat `GET /api/runs` reports? (Unknown: not gone.) */
function workerGone(worker) {
  if (!worker) return false;
  return !worker.alive || (worker.heartbeatAgeMs ?? 0) > HEARTBEAT_STALE_MS;
}

export class WorkerWatch {
  /** `view`: the ChatView whose run (`view.stream`) this watches. */
  constructor(view) {
    this.view = view;
    this.timer = null;
    this.banner = null; // the WORKER_GONE banner, while shown
  }

  /** While `run` streams, ask every second whether a worker still beats. */
  watch(run) {
    const view = this.view;
    const stream = view.stream;
    clearTimeout(this.timer);
    this.timer = setTimeout(async () => {
      if (run !== stream.run || !stream.source) return;
      try {
        const found = await api(`/api/runs?conversation=${encodeURIComponent(view.conversation)}&limit=1`);
        const info = found.runs[0];
        if (run === stream.run && info && info.id === run && info.status === "running" && workerGone(found.worker)) {
          this.stopped(found.worker);
        }
      } catch {
        // Unreachable API: the stream's own reconnection says so.
      }
      if (run === stream.run && stream.source) this.watch(run);
    }, WORKER_CHECK_MS);
  }

  /** The stream is closed: no more asking. */
  stop() {
    clearTimeout(this.timer);
  }

  /** No worker beats for the running run: say so, and mark the partial answer interrupted. */
  stopped(worker) {
    if (this.banner) return;
    const view = this.view;
    const age = worker.heartbeatAgeMs;
    const ago = age !== undefined ? ` (its last heartbeat was ${Math.round(age / 1000)} s ago)` : "";
    this.banner = view.banners.show({
      code: "WORKER_GONE",
      message: `The worker writing this answer stopped${ago}. The answer is interrupted; `
        + "Resume finishes it once a worker is back.",
    });
    // The answer stays open: should tokens come after all, they go on in the same bubble.
    view.transcript.interruptAnswer();
    view.setStatus("interrupted");
    // Nothing is left to stop, and the list says what the header says (the API still has the
    // run running: only a worker back records it interrupted).
    view.stopButton.hidden = true;
    view.sidebar.showStatus(view.conversation, "interrupted");
  }

  /** Tokens came after all (the heartbeat was only late): take the warning back. */
  back() {
    if (!this.banner) return;
    this.dismiss();
    this.view.transcript.uninterruptAnswer();
    this.view.stopButton.hidden = false;
  }

  /** The run failed (its own banner says why): the warning goes. */
  dismiss() {
    if (this.banner) this.banner.remove();
    this.banner = null;
    this.view.sidebar.showStatus(this.view.conversation, null);
  }

  /** Another conversation is shown: its banners were cleared, the warning with them. */
  forget() {
    this.banner = null;
  }
}
