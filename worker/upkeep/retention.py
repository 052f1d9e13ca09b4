"""``CONVERSATION_RETENTION_DAYS``: conversations idle longer than that are deleted.

Idle means untouched: the conversation's ``updated_at`` (written when it is created
and when each of its runs ends) is older than the retention. The live worker's
sweep calls :meth:`Retention.once` every few seconds; it picks the longest idle
conversations, a small batch at a time (through the ``conversations_updated``
index), and deletes each exactly as ``DELETE /api/conversations/{id}`` does: the
delete claims the conversation in one script (so no run can be accepted for it
meanwhile, and one queued or running keeps it), and the worker's delete job, taken
between runs like any job, removes its thread, rows and Redis records
(worker/upkeep/deletion.py), logs ``conversation.deleted`` with ``reason=retention`` and
counts it in ``sophos_conversations_expired_total``.

Progress past what cannot be deleted now: the passes walk the idle conversations
with a cursor, oldest first, and start again from the oldest once past the last.
One with a run queued or running (or whose delete failed) is skipped this time
round and met again on the next round, instead of being picked first by every pass
and holding back those behind it. At most :data:`BATCH` deletes queued by this
worker wait at a time, so a backlog never holds the queue for the runs.
"""

from __future__ import annotations

import time
import uuid

import structlog
from redis.asyncio import Redis

from shared.contracts.jobs import DeleteJob, delete_claim
from shared.redis.keys import ACTIVE_RUNS
from shared.redis.queue import submit_delete
from shared.storage import Database
from shared.storage.schema import iso_from_timestamp
from worker.upkeep.deletion import RETENTION

log = structlog.get_logger(__name__)

#: Conversations whose delete is queued per pass: a large backlog drains a batch every few
#: seconds, between runs, instead of holding the queue.
BATCH = 10
DAY_SECONDS = 86_400.0

_IDLE_SQL = (
    "SELECT id, updated_at FROM conversations"
    " WHERE updated_at < ? AND (updated_at > ? OR (updated_at = ? AND id > ?))"
    " ORDER BY updated_at, id LIMIT ?"
)
#: The cursor of a round's start: before every conversation.
_START = ("", "")


class Retention:
    def __init__(self, db: Database, redis: Redis, days: float) -> None:
        self.db = db
        self.redis = redis
        self.days = days
        #: (updated_at, id) of the last conversation looked at this round
        self._after = _START
        #: conversation id -> claim of the deletes this worker queued that still wait
        self._waiting: dict[str, str] = {}

    async def once(self, now: float | None = None) -> int:
        """Queue the delete of the next idle conversations past the retention; how many."""
        await self._forget_done()
        room = BATCH - len(self._waiting)
        if room <= 0:
            return 0
        cutoff = iso_from_timestamp((now if now is not None else time.time()) - self.days * DAY_SECONDS)
        after_updated, after_id = self._after
        rows = await self.db.fetchall(
            _IDLE_SQL, (cutoff, after_updated, after_updated, after_id, room)
        )
        idle = [(str(r[0]), str(r[1])) for r in rows]
        # A short page is the end of this round: the next pass starts again from the oldest.
        self._after = (idle[-1][1], idle[-1][0]) if len(idle) == room else _START
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
        if held:
            log.debug("retention.held", held=held, queued=queued)
        return queued

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
