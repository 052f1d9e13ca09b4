"""Pruning old checkpoints: an operator's prune job, and the ``CHECKPOINT_PRUNE=latest`` policy.

What a thread keeps and what goes is decided in shared/storage/threads/pruning.py (each branch's latest
checkpoint, what its state is rebuilt from, every branch from the first fork point down). Here:
which conversations, in what batches, and what is left alone.

- **Bounded batches.** Conversations are walked in ``(updated_at, id)`` order from a cursor,
  :data:`BATCH` at a time, each thread in a transaction of its own. An operator's prune
  (``POST /api/checkpoints/prune``, ``sophos prune``) is one arq job per batch, each enqueueing
  the next, so runs are taken between batches; its progress is a Redis hash (``prune_key``).
  The policy prunes one batch per upkeep pass (the sweep's, every few seconds); its cursor never
  starts again from the oldest: a conversation moves to the end of the order when a run of it
  ends (``updated_at``), so it is met again after each change, and an unchanged one never.
- **Never under a run.** A conversation with a run queued, running or waiting for its turn (its
  claim in ``ACTIVE_RUNS``, its waiting list), or whose last run is ``waiting`` (an approval) or
  still recorded ``running`` (a dead worker's, not yet recovered), is skipped this time; the
  policy meets it again once the run ends. A run that starts while its thread is pruned
  continues from the head, which is kept with everything it reads.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import structlog
from langgraph.checkpoint.base import BaseCheckpointSaver
from redis.asyncio import Redis
from redis.exceptions import RedisError

from shared.contracts.jobs import PruneJob
from shared.contracts.runs import RunStatus
from shared.redis.keys import ACTIVE_RUNS, PRUNE_PROGRESS_TTL_SECONDS, prune_key, waiting_key
from shared.redis.queue import submit_prune
from shared.storage import Database
from shared.storage.threads.pruning import prune_thread
from worker.entry import entry_point

log = structlog.get_logger(__name__)

#: conversations per batch: a policy pass, or one job of an operator's prune
BATCH = 20
#: a last run in one of these keeps its thread as it is for now
BUSY = (RunStatus.WAITING.value, RunStatus.RUNNING.value, RunStatus.QUEUED.value)

_NEXT_SQL = (
    "SELECT c.id, c.updated_at, c.branch_head, r.status FROM conversations c"
    " LEFT JOIN runs r ON r.id = c.last_run_id"
    " WHERE c.updated_at > ? OR (c.updated_at = ? AND c.id > ?)"
    " ORDER BY c.updated_at, c.id LIMIT ?"
)


@dataclass(frozen=True, slots=True)
class Batch:
    conversations: int
    skipped: int
    kept: int
    deleted: int
    #: the cursor after this batch: ``(updated_at, id)`` of its last conversation
    after: tuple[str, str]
    #: fewer conversations than asked for: none is left after the cursor
    last: bool


async def prune_batch(
    db: Database, saver: BaseCheckpointSaver[Any], redis: Redis, after: tuple[str, str], limit: int = BATCH,
) -> Batch:
    """Prune the threads of the next ``limit`` conversations after ``after``."""
    after_updated, after_id = after
    rows = await db.fetchall(_NEXT_SQL, (after_updated, after_updated, after_id, limit))
    ids = [str(r[0]) for r in rows]
    held: list[Any] = []
    waiting: list[Any] = []
    if ids:
        held = await redis.hmget(ACTIVE_RUNS, ids)  # type: ignore[misc]
        async with redis.pipeline(transaction=False) as pipe:
            for conversation_id in ids:
                pipe.llen(waiting_key(conversation_id))
            waiting = await pipe.execute()
    skipped = kept = deleted = 0
    for (conversation_id, _, head, status), holder, behind in zip(rows, held, waiting, strict=True):
        if holder is not None or behind or status in BUSY:
            skipped += 1
            continue
        pruned = await prune_thread(saver, str(conversation_id), str(head) if head else None)
        kept, deleted = kept + pruned.kept, deleted + pruned.deleted
        if pruned.deleted:
            log.info(
                "checkpoints.pruned", conversation_id=str(conversation_id),
                deleted=pruned.deleted, kept=pruned.kept,
            )
    cursor = (str(rows[-1][1]), str(rows[-1][0])) if rows else after
    return Batch(len(rows), skipped, kept, deleted, cursor, len(rows) < limit)


class Pruning:
    """``CHECKPOINT_PRUNE=latest``: one batch per upkeep pass (the sweep's ``also``)."""

    def __init__(self, db: Database, saver: BaseCheckpointSaver[Any], redis: Redis) -> None:
        self.db = db
        self.saver = saver
        self.redis = redis
        #: ``(updated_at, id)`` of the last conversation pruned; from the oldest at start-up
        self._after = ("", "")

    async def once(self) -> int:
        """Prune the next batch of conversations changed since they were last met; how many."""
        batch = await prune_batch(self.db, self.saver, self.redis, self._after)
        self._after = batch.after
        return batch.conversations - batch.skipped


async def prune(db: Database, saver: BaseCheckpointSaver[Any], redis: Redis, job: PruneJob) -> str:
    """One batch of an operator's prune; the next is enqueued, or the prune recorded done."""
    key = prune_key(job.job_id)
    try:
        batch = await prune_batch(db, saver, redis, (job.after_updated, job.after_id))
    except Exception as exc:
        outcome = f"failed: {type(exc).__name__}: {exc}"
        log.exception("checkpoints.prune_failed", batch=job.batch)
        await _record(redis, key, {"state": outcome, "finished_at": time.time()})
        return outcome
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hincrby(key, "conversations", batch.conversations)
        pipe.hincrby(key, "skipped", batch.skipped)
        pipe.hincrby(key, "kept", batch.kept)
        pipe.hincrby(key, "deleted", batch.deleted)
        pipe.hset(key, "batches", str(job.batch + 1))
        if batch.last:
            pipe.hset(key, mapping={"state": "done", "finished_at": time.time()})
        pipe.expire(key, PRUNE_PROGRESS_TTL_SECONDS)
        await pipe.execute()
    if batch.last:
        totals = await redis.hgetall(key)  # type: ignore[misc]
        log.info("checkpoints.prune_done", **{_text(k): _text(v) for k, v in totals.items()})
        return "done"
    after_updated, after_id = batch.after
    await submit_prune(redis, PruneJob(job.job_id, time.time(), after_updated, after_id, job.batch + 1))
    return "continued"


async def _record(redis: Redis, key: str, fields: dict[str, Any]) -> None:
    try:
        async with redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping=fields)
            pipe.expire(key, PRUNE_PROGRESS_TTL_SECONDS)
            await pipe.execute()
    except RedisError as exc:  # the progress lost, nothing else
        log.warning("checkpoints.prune_record_failed", error=str(exc))


def _text(value: str | bytes) -> str:
    # The worker's client returns bytes (arq's pool does not decode).
    return value.decode() if isinstance(value, bytes) else str(value)


@entry_point(PruneJob)
async def prune_job(ctx: dict[str, Any], job: PruneJob) -> str:
    """arq's entry point."""
    return await prune(ctx["store"].db, ctx["saver"], ctx["redis"], job)
