"""``CONVERSATION_RETENTION_DAYS``: conversations idle longer than that are deleted.

Idle means untouched: the conversation's ``updated_at`` (written when it is created
and when each of its runs ends) is older than the retention. The live worker's
sweep calls :meth:`Retention.once` every few seconds; it picks the longest idle
conversations, a small batch at a time (through the ``conversations_updated``
index), and deletes each exactly as ``DELETE /api/conversations/{id}`` does: the
delete claims the conversation in one script (so no run can be accepted for it
meanwhile, and one queued or running keeps it), and the worker's delete job, taken
between runs like any job, removes its thread, rows and Redis records
(worker/deletion.py), logs ``conversation.deleted`` with ``reason=retention`` and
counts it in ``sophos_conversations_expired_total``.
"""

from __future__ import annotations

import time
import uuid

import structlog
from redis.asyncio import Redis

from shared.contracts import DeleteJob, delete_claim
from shared.queue import submit_delete
from shared.schema import iso_from_timestamp
from worker.deletion import RETENTION
from worker.runs import RunService

log = structlog.get_logger(__name__)

#: Conversations whose delete is queued per pass: a large backlog drains a batch every few
#: seconds, between runs, instead of holding the queue.
BATCH = 10
DAY_SECONDS = 86_400.0

_IDLE_SQL = "SELECT id, updated_at FROM conversations WHERE updated_at < ? ORDER BY updated_at LIMIT ?"


class Retention:
    def __init__(self, service: RunService, redis: Redis, days: float) -> None:
        self.service = service
        self.redis = redis
        self.days = days

    async def once(self, now: float | None = None) -> int:
        """Queue the delete of the longest idle conversations past the retention; how many."""
        cutoff = iso_from_timestamp((now if now is not None else time.time()) - self.days * DAY_SECONDS)
        rows = await self.service.store.db.fetchall(_IDLE_SQL, (cutoff, BATCH))
        idle = [(str(r[0]), str(r[1])) for r in rows]
        queued = 0
        for conversation_id, updated_at in idle:
            job = DeleteJob(conversation_id, delete_claim(str(uuid.uuid4())), time.time(), RETENTION)
            holder = await submit_delete(self.redis, job)
            if holder is not None:  # a run of it is queued or running, or its delete already is
                continue
            queued += 1
            log.info(
                "conversation.expiring", conversation_id=conversation_id, job_id=job.claim,
                updated_at=updated_at, retention_days=self.days,
            )
        return queued
