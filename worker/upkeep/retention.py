"""``CONVERSATION_RETENTION_DAYS``: conversations idle longer than that are deleted.

Idle means untouched: the conversation's ``updated_at`` (written when it is created
and when each of its runs ends) is older than the retention. The live worker's
sweep calls :meth:`Retention.once` on each pass; it picks the longest idle
conversations, a small batch at a time (through the ``conversations_updated``
index), and deletes each exactly as ``DELETE /api/conversations/{id}`` does: the
delete claims the conversation in one script (so no run can be accepted for it
meanwhile, and one queued or running keeps it), and the worker's delete job, taken
between runs like any job, removes its thread, rows and Redis records
(worker/upkeep/deletion.py), logs ``conversation.deleted`` with ``reason=retention`` and
counts it in ``sophos_conversations_expired_total``.

Self-clocking: a backlog (retention turned on for an old store) is not paced by the sweep's
passes. A pass queues a batch, waits for its deletes to be done (each pushes its outcome,
``deleted_key``: the wait is a blocking pop, not a poll) and queues the next one at once, for
up to :data:`~worker.upkeep.sweep.SWEEP_SECONDS`; the sweep's next pass, due by then, goes on
where it stopped. So the deletes go as fast as the worker does them, one batch at a time.

Live runs still go first, between batches: at most one batch of deletes queued by this worker
waits at a time, and before the next batch is queued, the runs waiting for a worker at that
moment (``QUEUED_READY``, due in arq's queue) must have been taken. The fair share takes a
delete (a job of its own, never served before) ahead of a run, so this is what keeps a run from
being overtaken batch after batch: a run waits behind at most one batch. That wait for the
runs is bounded by the pass: past it the batch is queued all the same, so a queue never
empty of runs cannot hold the retention back either (at worst a delete a pass: the batch is a
single delete then, below).

The batch adapts to the live runs: a run that arrives while a batch is queued waits behind
what is left of it, so when the look before a batch found runs waiting (live traffic), that
batch is a single delete, and each batch after it that found none is twice the one before, up
to :data:`BATCH`. Beside live runs a run then waits behind a delete or two, not ten; on an idle
service the batches are back to :data:`BATCH` within four.

Progress past what cannot be deleted now: the batches walk the idle conversations
with a cursor, oldest first, and start again from the oldest once past the last.
One with a run queued or running (or whose delete failed) is skipped this time
round and met again on the next round, instead of being picked first by every batch
and holding back those behind it. It does not count in the batch: a batch of one passes over
the held ones to the next it can delete.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import structlog
from redis.asyncio import Redis

from shared.contracts.jobs import DeleteJob, delete_claim
from shared.redis.keys import ACTIVE_RUNS, QUEUE_NAME, QUEUED_READY, deleted_key
from shared.redis.queue import submit_delete
from shared.storage import Database
from shared.storage.schema import iso_from_timestamp
from worker.upkeep.deletion import RETENTION
from worker.upkeep.sweep import SWEEP_SECONDS

log = structlog.get_logger(__name__)

#: The most deletes this worker's retention has queued and not yet done, a batch's size while no
#: run is found waiting: a run submitted meanwhile waits behind at most these (they are each a
#: job of their own to the fair share).
BATCH = 10
#: The size of a batch queued after runs were found waiting: what a run arriving next waits behind.
LIVE_BATCH = 1
DAY_SECONDS = 86_400.0
#: The longest one blocking wait for a batch's deletes (each done one wakes it at once).
DONE_WAIT_SECONDS = 1.0
#: How often the runs waiting for a worker are looked at again until they are taken.
RUNS_POLL_SECONDS = 0.02
#: Queued runs looked at before a batch (arq reads at most 100 due jobs at a time anyway).
RUNS_LOOKED_AT = 100

_IDLE_SQL = (
    "SELECT id, updated_at FROM conversations"
    " WHERE updated_at < ? AND (updated_at > ? OR (updated_at = ? AND id > ?))"
    " ORDER BY updated_at, id LIMIT ?"
)
#: The cursor of a round's start: before every conversation.
_START = ("", "")


class Retention:
    def __init__(self, db: Database, redis: Redis, days: float, *, budget: float = SWEEP_SECONDS) -> None:
        self.db = db
        self.redis = redis
        self.days = days
        #: how long one pass may go on queueing batch after batch (the sweep's interval)
        self.budget = budget
        #: (updated_at, id) of the last conversation looked at this round
        self._after = _START
        #: conversation id -> claim of the deletes this worker queued that still wait
        self._waiting: dict[str, str] = {}
        #: a backlog is being worked off: the batches since its first were clocked by deletes
        self._draining = False
        #: the next batch's size: LIVE_BATCH after runs were found waiting, doubled up to BATCH since
        self._size = BATCH

    async def once(self, now: float | None = None) -> int:
        """Queue the deletes of the idle conversations past the retention, a batch as soon as the
        last one's are done, for up to ``budget`` seconds; how many were queued."""
        deadline = time.monotonic() + self.budget
        total = 0
        while True:
            if not await self._until_done(deadline):
                return total  # still waiting: the next pass goes on waiting
            let_through = await self._until_runs_taken(deadline)
            self._size = LIVE_BATCH if let_through else min(BATCH, self._size * 2)
            queued, more = await self._queue_batch(now)
            total += queued
            if queued or more:
                log.info(
                    "retention.batch", queued=queued, size=self._size,
                    after="deletes" if self._draining else "pass", runs_first=let_through,
                )
            self._draining = bool(queued or more)
            if not self._draining or time.monotonic() >= deadline:
                return total

    async def _queue_batch(self, now: float | None) -> tuple[int, bool]:
        """Queue the next batch of deletes, ``_size`` of them (none of this worker's waits now): the
        conversations passed over because they are held do not count; how many, and whether the
        round goes on."""
        cutoff = iso_from_timestamp((now if now is not None else time.time()) - self.days * DAY_SECONDS)
        queued = held = 0
        more = True
        while more and queued < self._size - len(self._waiting):
            page_queued, page_held, more = await self._queue_page(cutoff, self._size - len(self._waiting))
            queued, held = queued + page_queued, held + page_held
        if held:
            log.debug("retention.held", held=held, queued=queued)
        return queued, more

    async def _queue_page(self, cutoff: str, room: int) -> tuple[int, int, bool]:
        """Queue the deletes of the next ``room`` idle conversations of the round; how many, how
        many were held, and whether the round goes on."""
        after_updated, after_id = self._after
        rows = await self.db.fetchall(
            _IDLE_SQL, (cutoff, after_updated, after_updated, after_id, room)
        )
        idle = [(str(r[0]), str(r[1])) for r in rows]
        # A short page is the end of this round: the next batch starts again from the oldest.
        more = len(idle) == room
        self._after = (idle[-1][1], idle[-1][0]) if more else _START
        queued = held = 0
        for conversation_id, updated_at in idle:
            job = DeleteJob(conversation_id, delete_claim(str(uuid.uuid4())), time.time(), RETENTION)
            holder = await submit_delete(self.redis, job)
            if holder is not None:  # a run of it is queued or running, or its delete already is
                held += 1
                continue
            queued += 1
            self._waiting[conversation_id] = job.claim
            log.info(
                "conversation.expiring", conversation_id=conversation_id, job_id=job.claim,
                updated_at=updated_at, retention_days=self.days,
            )
        return queued, held, more

    async def _until_done(self, deadline: float) -> bool:
        """Wait for this worker's queued deletes to be done, until ``deadline``; True if they are.

        Each done delete pushes its outcome (worker/upkeep/deletion.py) and wakes the wait; no one
        else waits on a retention delete's outcome. A delete that ends otherwise (arq dropped it
        and the sweep freed its claim) is seen when the wait times out.
        """
        while True:
            await self._forget_done()
            left = deadline - time.monotonic()
            if not self._waiting:
                return True
            if left <= 0:
                return False
            keys = [deleted_key(claim) for claim in self._waiting.values()]
            await self.redis.blpop(keys, timeout=min(left, DONE_WAIT_SECONDS))  # type: ignore[misc, arg-type]  # float timeouts work on Redis >= 6

    async def _until_runs_taken(self, deadline: float) -> int:
        """Wait, until ``deadline``, for the runs waiting for a worker now to be taken; how many.

        Runs queued later may land behind the next batch: they wait for it, one batch at most.
        """
        waiting = await self._runs_waiting()
        while waiting and time.monotonic() < deadline:
            await asyncio.sleep(RUNS_POLL_SECONDS)
            still = await self.redis.zmscore(QUEUED_READY, waiting)
            if all(score is None for score in still):
                break
        return len(waiting)

    async def _runs_waiting(self) -> list[str]:
        """The runs due now and not yet taken by a worker (in ``QUEUED_READY`` and due in arq's queue)."""
        ready = await self.redis.zrange(QUEUED_READY, 0, RUNS_LOOKED_AT - 1)
        if not ready:
            return []
        scores = await self.redis.zmscore(QUEUE_NAME, ready)
        now_ms = time.time() * 1000
        return [
            r.decode() if isinstance(r, bytes) else str(r)
            for r, score in zip(ready, scores, strict=True)
            if score is not None and score <= now_ms
        ]

    async def _forget_done(self) -> None:
        """Drop the deletes that no longer hold their conversation: done, failed or swept."""
        if not self._waiting:
            return
        ids = list(self._waiting)
        holders = await self.redis.hmget(ACTIVE_RUNS, ids)  # type: ignore[misc]
        for conversation_id, holder in zip(ids, holders, strict=True):
            # The worker's client returns bytes (arq's pool does not decode).
            held_by = holder.decode() if isinstance(holder, bytes) else holder
            if held_by != self._waiting[conversation_id]:
                del self._waiting[conversation_id]
