"""Leases on PostgreSQL: which worker executes a run, and what happens when it stops answering.

With ``DATABASE_URL=postgresql://…`` any number of workers share the database, so "every
``running`` row belongs to a dead worker" (SQLite's start-up rule, under its writer lock) no
longer holds. Instead each run is leased to the worker that started it (``runs.lease_owner``,
``runs.lease_expires`` by the database's clock; ``RUN_LEASE_SECONDS``), and every worker, every
third of a lease:

* **renews** the leases of the runs it executes, in one statement; a run whose lease it no
  longer holds (it was paused past the lease, and another worker took the run over) is cut
  and dropped without a further write: its checkpoints and its outcome are fenced by the
  lease (shared/storage/postgres.py, worker/store.py), so nothing of it could land anyway;
* **takes over** every run whose lease lapsed (its worker died, or hangs): leases it to
  itself, then records it ``interrupted`` exactly as start-up recovery does for SQLite
  (worker/run/lifetime/recovery.py), frees its conversation and ends its stream. The lapsed run is never
  executed again by itself; it is resumable like any interrupted run.

A run is therefore marked interrupted within the lease plus one pass after its worker died.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import structlog

from shared.storage import is_database_unavailable
from worker.run.lifetime.stopping import LiveRuns
from worker.store import RunRow, RunStore

log = structlog.get_logger(__name__)


class Leases:
    def __init__(
        self, store: RunStore, live: LiveRuns, reconcile: Callable[[RunRow], Awaitable[None]],
    ) -> None:
        """``reconcile`` ends a run taken over (worker/run/lifetime/recovery.py)."""
        self.store = store
        self.live = live
        self.reconcile = reconcile
        self.interval = store.lease_seconds / 3
        self._task: asyncio.Task[None] | None = None

    async def renew(self) -> set[str]:
        """Renew this worker's leases; cut the runs whose lease it lost. The runs it lost."""
        executing = set(self.live)  # before the renew: a run listed later was leased after
        held = await self.store.renew(executing)
        lost = {run_id for run_id in executing - held if run_id in self.live}
        for run_id in lost:
            log.warning("run.lease_lost", run_id=run_id)
            self.live.lose(run_id)
        return lost

    async def take_over(self) -> int:
        """Record ``interrupted`` each run whose lease lapsed; how many this worker took."""
        taken = 0
        for run in await self.store.lapsed_runs():
            if run.id in self.live or not await self.store.take_over(run.id):
                continue  # ours (about to be found lost), or another worker was first
            taken += 1
            try:
                await self.reconcile(run)
            except Exception as exc:
                if is_database_unavailable(exc):
                    raise  # the next pass tries again: the lease it took lapses like any other
                log.exception("run.takeover_failed", run_id=run.id, conversation_id=run.conversation_id)
        return taken

    async def once(self) -> None:
        await self.renew()
        await self.take_over()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.once()
            except Exception as exc:
                log.warning("leases.pass_failed", error=f"{type(exc).__name__}: {exc}")

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="leases")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
