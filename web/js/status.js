// A run's or a conversation's status, in the words the page shows (the API's `cancelled` is
// what the user did: "stopped"), and which of them mean the run is still going.

/** The statuses of a run still going: its stream can be followed, or reconnected to. */
export const ACTIVE = new Set(["queued", "running"]);

const STATUS_LABELS = {
  queued: "queued",
  running: "running",
  completed: "completed",
  failed: "failed",
  interrupted: "interrupted",
  cancelled: "stopped",
  waiting: "waiting for approval",
};

export function statusLabel(status) {
  return STATUS_LABELS[status] || status;
}

/** `status` as the lists show it (the sidebar, the runs view): a `.status-<status>` badge. */
export function statusBadge(status) {
  const badge = document.createElement("span");
  badge.className = `status status-${status}`;
  badge.textContent = statusLabel(status);
  return badge;
}
