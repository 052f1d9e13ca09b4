"""The runs in progress in this worker: what a cancel cuts, a shutdown drains, a lost lease drops.

The run service lists a run here for as long as its graph streams (worker/run/service.py);
the cancel subscription (worker/run/progress.py), the leases (worker/run/leases.py), the
sweep and a shutdown (worker/__main__.py) reach the runs through this registry alone.
"""

from __future__ import annotations

from collections.abc import Iterator

import structlog
from redis.asyncio import Redis

from worker.run.progress import CancelSignals
from worker.run.stopping import LiveRun

log = structlog.get_logger(__name__)


class LiveRuns:
    """Run id → :class:`LiveRun`, for the runs streaming now."""

    def __init__(self) -> None:
        self._runs: dict[str, LiveRun] = {}

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._runs

    def __iter__(self) -> Iterator[str]:
        return iter(self._runs)

    def __len__(self) -> int:
        return len(self._runs)

    def add(self, run_id: str, live: LiveRun) -> None:
        self._runs[run_id] = live

    def remove(self, run_id: str) -> None:
        self._runs.pop(run_id, None)

    def drain(self, reason: str = "shutdown") -> int:
        """Ask every run to stop at its next step boundary; how many there are."""
        for live in self._runs.values():
            if not live.stopping:  # a run being cut for a cancel stays cancelled
                live.control.request_drain(reason)
        return len(self._runs)

    def stop(self, run_id: str) -> None:
        """Cut ``run_id`` now if it is in progress here (a cancel was asked)."""
        live = self._runs.get(run_id)
        if live is not None and live.stop():
            log.info("run.cancel_requested", run_id=run_id, node=live.node)

    async def abandon(self) -> int:
        """End every run still in progress ``interrupted`` now: SIGTERM past ``SHUTDOWN_TIMEOUT``.

        Its step did not reach a boundary in time (a call that does not yield to
        cancellation, a tool that ignores it): the run is recorded and its stream ended
        before the worker closes its stores, whatever the step goes on doing.
        """
        late = [live for live in self._runs.values() if live.abandon is not None and not live.ended]
        for live in late:
            try:
                await live.abandon()  # type: ignore[misc]
            except Exception:
                log.exception("run.abandon_failed")
        return len(late)

    def lose(self, run_id: str) -> None:
        """Drop ``run_id``: its lease is another worker's now (worker/run/leases.py); nothing more is
        written."""
        live = self._runs.get(run_id)
        if live is not None:
            live.lease_lost = True
            live.stop()

    def cancel_signals(self, redis: Redis) -> CancelSignals:
        """The worker's one subscription to cancels (an async context manager, for its life)."""
        return CancelSignals(redis, self.stop, lambda: list(self._runs))
