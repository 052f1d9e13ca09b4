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
  (worker/run/recovery.py), frees its conversation and ends its stream. The lapsed run is never
  executed again by itself; it is resumable like any interrupted run.

A run is therefore marked interrupted within the lease plus one pass after its worker died.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import structlog
from langgraph.checkpoint.base import BaseCheckpointSaver

from shared.storage import is_database_unavailable
from worker.run.recovery import reconcile
from worker.run.service import RunService

log = structlog.get_logger(__name__)


class Leases:
    def __init__(self, service: RunService, saver: BaseCheckpointSaver[Any]) -> None:
        self.service = service
        self.saver = saver
        self.interval = service.store.lease_seconds / 3
        self._task: asyncio.Task[None] | None = None

    async def renew(self) -> set[str]:
        """Renew this worker's leases; cut the runs whose lease it lost. The runs it lost."""
        executing = set(self.service.live)  # before the renew: a run listed later was leased after
        held = await self.service.store.renew(executing)
        lost = {run_id for run_id in executing - held if run_id in self.service.live}
        for run_id in lost:
            log.warning("run.lease_lost", run_id=run_id)
            self.service.lose(run_id)
        return lost

    async def take_over(self) -> int:
        """Record ``interrupted`` each run whose lease lapsed; how many this worker took."""
        taken = 0
        for run in await self.service.store.lapsed_runs():
            if run.id in self.service.live or not await self.service.store.take_over(run.id):
                continue  # ours (about to be found lost), or another worker was first
            taken += 1
            try:
                await reconcile(self.service, self.saver, run)
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
