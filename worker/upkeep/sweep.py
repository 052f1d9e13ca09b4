"""The live worker's sweep: no claim outlives its run, no index outlives its records.

A conversation is claimed in ``ACTIVE_RUNS`` from the moment its run is accepted
until the worker records the run's outcome. Whatever ends a run without the
worker seeing it leaves the claim behind, and with it a conversation that
answers 409 for ever: above all arq, which drops a job whose record expired
while it was still queued ("job expired") without calling the job function.
Start-up recovery cannot see that in a worker that keeps running, so every
``SWEEP_SECONDS`` the sweep looks at each claim and releases it when its run is

* not queued: not in arq's queue with a live job record (a job arq runs stays in
  the queue until it ends, so this covers a run being executed too),
* not taken: no arq in-progress marker (set from the instant arq takes the job to
  the moment it is done with it, so a job taken just now is left alone),
* not executing in this worker (its run control is held), and
* not recorded ``running`` in the database (the one worker is this live one).

The first two are read at one instant (a script) and only ever turn false, so a
run found gone stays gone: no row can appear for it after the look (see
:func:`shared.redis.queue.gone_runs`). A run that has a finished row only lost its
release (a Redis error, or a crash between outcome and release): the claim is
released with the compare-and-delete, and a client still waiting gets the
terminal event rebuilt from the row by the relay. A run without a row never
started and never will: one script releases the claim, records the run
``failed`` in its Redis description (the API answers ``/api/runs/{id}`` from
it), publishes its ``chat-error`` event, so waiting SSE clients end, and counts it.
A delete claim whose job is gone is only released: it is no run, and has no outcome.
On PostgreSQL a run taken by a worker that died before recording it is neither gone
nor recorded: its taker's name (``taken_key``) and dead heartbeat tell, and the
sweep forgets its job and drops it the same way.

The sweep also bounds ``CANCELLED_RUNS``, the index of runs cancelled while queued:
an entry whose record has expired is removed (a slice of the index per pass, so
every entry is looked at within a few passes), and no entry outlives the longest
a record can live.

After each pass the sweep runs its other tasks (``also``: approval deadlines, retention,
pruning, threads' expiry). A pass starts ``SWEEP_SECONDS`` after the last one started, or at
once when the last one took longer: the retention working off a backlog goes on for up to an
interval (worker/upkeep/retention.py), so claims are still looked at every few seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass

import structlog
from arq.constants import expires_extra_ms
from redis.asyncio import Redis
from redis.exceptions import RedisError

from shared.contracts.jobs import is_delete_claim
from shared.contracts.runs import RunErrorCode, RunStatus
from shared.redis.keys import (
    ACTIVE_RUNS,
    CANCELLED_RETENTION_SECONDS,
    CANCELLED_RUNS,
    QUEUE_NAME,
    arq_in_progress_key,
    arq_job_key,
    arq_retry_key,
    run_key,
    taken_key,
    worker_heartbeat_key,
)
from shared.redis.queue import drop_unstarted, gone_runs, release_conversation
from worker.store import RunStore

log = structlog.get_logger(__name__)

#: Seconds between two passes: how long a conversation can stay claimed by a run
#: that will never run.
SWEEP_SECONDS = 5.0
#: Claims read per round trip, and entries of the cancelled index looked at per pass.
BATCH = 200

NEVER_STARTED = (
    "the run never started: its job left the queue without running (arq drops a job that "
    "waited longer than a day, or whose record was lost); nothing of it was recorded, "
    "send the message again"
)

TAKER_DIED = (
    "the worker that took the run stopped before recording it; nothing of it was recorded, "
    "send the message again"
)


@dataclass(frozen=True, slots=True)
class SweepReport:
    #: claims released for runs that never started (recorded failed)
    dropped: int = 0
    #: claims released for runs that had already finished
    released: int = 0
    #: entries removed from the cancelled index
    pruned: int = 0


class ClaimSweep:
    def __init__(
        self,
        redis: Redis,
        store: RunStore,
        *,
        executing: Callable[[], Collection[str]],
        event_retention: int,
        interval: float = SWEEP_SECONDS,
        also: Sequence[Callable[[], Awaitable[object]]] = (),
    ) -> None:
        self.redis = redis
        self.store = store
        #: the runs this worker is executing now
        self.executing = executing
        self.event_retention = event_retention
        self.interval = interval
        #: run after each pass, each on its own (approval deadlines, retention: which may go on
        #: for up to ``interval``, worker/upkeep/retention.py)
        self.also = tuple(also)
        self._cancelled_cursor = 0
        self._task: asyncio.Task[None] | None = None

    async def once(self) -> SweepReport:
        """One pass over the claims and the cancelled index. Raises Redis errors as they are."""
        dropped = released = 0
        cursor = 0
        while True:
            cursor, claims = await self.redis.hscan(ACTIVE_RUNS, cursor, count=BATCH)
            d, r = await self._sweep(claims)
            dropped, released = dropped + d, released + r
            if cursor == 0:
                break
        pruned = await self._prune_cancelled()
        return SweepReport(dropped, released, pruned)

    async def _sweep(self, claims: dict[str, str]) -> tuple[int, int]:
        executing = self.executing()
        conversation_of = {_text(r): _text(c) for c, r in claims.items() if _text(r) not in executing}
        dropped = released = 0
        gone = await gone_runs(self.redis, list(conversation_of))
        not_gone = set(conversation_of) - set(gone)
        taken = [run_id for run_id in conversation_of if run_id in not_gone]
        dropped += await self._drop_taken_by_the_dead(taken, conversation_of)
        for run_id in gone:
            conversation_id = conversation_of[run_id]
            if is_delete_claim(run_id):
                # A delete whose job arq dropped: no run to end, only the conversation to free
                # (the client that asked sees it still there and may ask again).
                if await release_conversation(self.redis, conversation_id, run_id):
                    released += 1
                    log.warning("delete.released_stale_claim", claim=run_id, conversation_id=conversation_id)
                continue
            # After the look above: a row of this run, if any, is already written.
            try:
                row = await self.store.get_run(run_id)
            except Exception as exc:
                log.warning("sweep.run_unreadable", run_id=run_id, error=f"{type(exc).__name__}: {exc}")
                continue
            if row is None:
                if await drop_unstarted(
                    self.redis, conversation_id, run_id,
                    code=RunErrorCode.INTERRUPTED.value, message=NEVER_STARTED,
                    event_retention=self.event_retention,
                ):
                    dropped += 1
                    log.warning("run.dropped_unstarted", run_id=run_id, conversation_id=conversation_id)
            elif RunStatus(row.status).finished and await release_conversation(
                self.redis, conversation_id, run_id
            ):
                released += 1
                log.warning(
                    "run.released_stale_claim", run_id=run_id, conversation_id=conversation_id,
                    status=row.status,
                )
            # else: recorded running, by this worker (there is no other): its end releases it.
        return dropped, released

    async def _drop_taken_by_the_dead(self, run_ids: list[str], conversation_of: dict[str, str]) -> int:
        """Free the conversations of runs whose job a worker took and died before recording.

        The taker said who it was (``taken_key``, PostgreSQL); its heartbeat is gone and the
        run has no row: it never will (a worker records the run before anything else). arq's
        in-progress marker would hold the conversation for ``job_timeout + 10 s`` (a day)
        and then run the job again: the job is forgotten, and the run ends ``failed``.
        """
        if not run_ids:
            return 0
        takers = await self.redis.mget([taken_key(r) for r in run_ids])
        suspects = [(r, _text(t)) for r, t in zip(run_ids, takers, strict=True) if t is not None]
        if not suspects:
            return 0
        dropped = 0
        for run_id, worker_id in suspects:
            if await self.redis.exists(worker_heartbeat_key(worker_id)):
                continue  # its taker is alive: it records the run, or ends it
            if await self.store.get_run(run_id) is not None:
                continue  # recorded: its end (or a lease take-over) is someone else's
            conversation_id = conversation_of[run_id]
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.zrem(QUEUE_NAME, run_id)
                pipe.delete(arq_job_key(run_id), arq_in_progress_key(run_id), arq_retry_key(run_id))
                pipe.delete(taken_key(run_id))
                await pipe.execute()
            if await drop_unstarted(
                self.redis, conversation_id, run_id,
                code=RunErrorCode.INTERRUPTED.value, message=TAKER_DIED,
                event_retention=self.event_retention,
            ):
                dropped += 1
                log.warning("run.dropped_taken_by_dead_worker", run_id=run_id, worker=worker_id,
                            conversation_id=conversation_id)
        return dropped

    async def _prune_cancelled(self) -> int:
        # No record lives longer than this after its run was enqueued: a run is cancelled
        # at most a queued job's life (arq's expiry) after it, and kept that long after.
        oldest_ms = (time.time() - CANCELLED_RETENTION_SECONDS) * 1000 - expires_extra_ms
        pruned = int(await self.redis.zremrangebyscore(CANCELLED_RUNS, "-inf", oldest_ms))
        self._cancelled_cursor, entries = await self.redis.zscan(
            CANCELLED_RUNS, self._cancelled_cursor, count=BATCH
        )
        run_ids = [_text(member) for member, _ in entries]
        if run_ids:
            async with self.redis.pipeline(transaction=False) as pipe:
                for run_id in run_ids:
                    pipe.exists(run_key(run_id))
                kept = await pipe.execute()
            # A record, once expired, is never written again (the cancel script only
            # writes one for a run it takes out of the queue): the entry is dead.
            expired = [run_id for run_id, alive in zip(run_ids, kept, strict=True) if not alive]
            if expired:
                pruned += int(await self.redis.zrem(CANCELLED_RUNS, *expired))
        return pruned

    async def _forever(self) -> None:
        started = time.monotonic()
        while True:
            # A pass starts ``interval`` after the last one started: a pass whose tasks took long
            # (the retention working off a backlog takes up to an interval) is followed at once.
            await asyncio.sleep(max(0.0, started + self.interval - time.monotonic()))
            started = time.monotonic()
            try:
                report = await self.once()
            except RedisError as exc:
                log.warning("sweep.failed", error=str(exc) or type(exc).__name__)
                continue
            except Exception:
                # A bug must not end the sweep for the rest of the worker's life.
                log.exception("sweep.failed")
                continue
            if report.pruned:
                log.info("sweep.pruned_cancelled", entries=report.pruned)
            for task in self.also:
                try:
                    await task()
                except Exception:
                    log.exception("sweep.failed")

    def start(self) -> None:
        """Sweep every ``interval`` seconds in the background, until :meth:`stop`."""
        if self._task is None:
            self._task = asyncio.create_task(self._forever(), name="claim-sweep")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
