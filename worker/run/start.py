"""A run's start in the worker: said taken, recorded ``running`` once, or refused or skipped.

The run row is committed before the graph starts (worker/run/service.py says why). A second
delivery of a job whose run is recorded is skipped, and a run that cannot be recorded at all is
ended at once through the one ending (worker/run/outcome/ending.py): the client is told and the
conversation freed.
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

from shared.contracts.jobs import JobKind, RunJob
from shared.contracts.runs import RunErrorCode, RunStatus
from shared.redis.keys import TAKEN_SECONDS, taken_key
from shared.redis.queue import release_conversation
from shared.storage.rows import RunRow
from worker.run.outcome.ending import Outcome, RunEnding, Thread
from worker.run.outcome.outcomes import UnrecordedOutcomes
from worker.store import RunStore, is_database_unavailable

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class RunStart:
    redis: Redis
    store: RunStore
    #: outcomes the database refused: an earlier run's goes first
    unrecorded: UnrecordedOutcomes
    ending: RunEnding

    async def say_taken(self, job: RunJob) -> None:
        if self.store.owner is None:
            return
        # Several workers: say who took it before anything can fail, so a live worker's
        # sweep frees the conversation if this one dies before recording the run.
        try:
            await self.redis.set(taken_key(job.run_id), self.store.owner, ex=TAKEN_SECONDS)
        except RedisError as exc:
            log.warning("run.taken_unrecorded", error=str(exc))

    async def record(self, job: RunJob) -> str | None:
        """Record the run ``running``; None, or what the job returns instead of running it (it
        could not be recorded, or it was recorded by an earlier delivery)."""
        try:
            # An earlier run's outcome goes first: this run must not overtake it.
            if not await self.unrecorded.flush():
                raise DatabaseBusy("earlier outcomes are still waiting to be recorded")
            existing = await self.store.start_run(job)
        except Exception as exc:
            # Busy, full, malformed, or anything else: the run is not recorded, and the
            # client must still be told and the conversation freed (``_refuse``).
            existing = await self._recorded_before(job, exc)
            if existing is None:
                await self._refuse(job, exc)
                return RunStatus.FAILED.value
        return None if existing is None else await self._skip(job, existing)

    async def _recorded_before(self, job: RunJob, exc: Exception) -> RunRow | None:
        """The run's row after its start failed: a second delivery of a recorded run is skipped,
        busy database or not (a reader is never locked out in WAL mode)."""
        if not is_database_unavailable(exc) and not isinstance(exc, DatabaseBusy):
            log.error("run.start_failed", error=f"{type(exc).__name__}: {exc}", exc_info=exc)
        try:
            return await self.store.get_run(job.run_id)
        except Exception as again:
            log.warning("run.lookup_failed", error=f"{type(again).__name__}: {again}")
            return None

    async def _skip(self, job: RunJob, existing: RunRow) -> str:
        # arq delivers at least once; this run already started (and crashed,
        # or finished). Running it again would repeat the user's message.
        log.warning("run.duplicate_delivery", status=existing.status)
        if RunStatus(existing.status).finished:
            try:
                # Were it still named as the conversation's run, nothing would free it.
                await release_conversation(self.redis, job.conversation_id, job.run_id)
            except RedisError as exc:
                log.warning("run.release_failed", error=str(exc))
        return f"skipped: already {existing.status}"

    async def _refuse(self, job: RunJob, exc: BaseException) -> None:
        """The run could not even be recorded: tell the client and free the conversation."""
        log.warning("run.not_recorded", error=str(exc))
        again = "resume again" if job.kind is JobKind.RESUME else "send it again"
        outcome = Outcome(
            RunStatus.FAILED, RunErrorCode.DATABASE_UNAVAILABLE,
            f"the database could not be written ({exc}); nothing of this request was recorded, "
            f"{again} once it can be written",
        )
        # Its Redis description is its only record: the API answers for the run from it.
        await self.ending.end(job.run_id, job.conversation_id, outcome, thread=Thread(), recorded=False)


class DatabaseBusy(Exception):
    """Earlier outcomes still wait to be recorded: this run must not overtake them."""
