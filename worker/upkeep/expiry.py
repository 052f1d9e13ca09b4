"""Threads that expire: a thread given a ``ttl``, and a thread left empty.

The Agent Protocol's ``POST /threads`` (api/protocol/threads/records.py) puts each thread it
creates in ``PROTOCOL_THREAD_EXPIRY``, due at its creation plus its ``ttl`` (the Agent Server's
``{"strategy": "delete", "ttl": minutes}``) or, without one, plus
``EMPTY_THREAD_RETENTION_MINUTES``; an update with a ``ttl`` makes it due that long after the
update. A run without a thread (api/protocol/runs/stateless.py) and a cron's tick without one
(worker/schedule/crons/ticks.py) give the thread they make a short ``ttl``, made due once the run was
accepted: it goes once the run ended. The live worker's sweep calls :meth:`ThreadExpiry.once`
every few seconds; it looks at the threads due, a batch at a time:

- a thread with a conversation (it has had a run) and no ``ttl`` leaves the index: the
  conversation's retention (``CONVERSATION_RETENTION_DAYS``) governs it, as any conversation;
- a thread with a ``ttl`` whose conversation was active since (a run ended after the due time
  was set) is due again ``ttl`` after that activity: a ``ttl`` counts from the last activity;
- an empty thread with a cron is kept (its ticks are what it is for), looked at again later;
- the others are deleted exactly as ``DELETE /threads/{id}`` deletes: one script claims the
  thread (no run can be accepted for it meanwhile; one queued or running keeps it, and it is
  looked at again later) and enqueues the worker's delete job (worker/upkeep/deletion.py), which
  removes its checkpoints, rows and Redis records, and its crons, and logs ``conversation.deleted``
  with ``reason=expired``.

Only the worker writes the database, so only the worker deletes an expired thread, history or not.
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime

import structlog
from redis.asyncio import Redis

from shared.contracts.jobs import DeleteJob, delete_claim
from shared.redis.keys import PROTOCOL_THREAD_EXPIRY, protocol_thread_key
from shared.redis.queue import submit_delete
from shared.redis.threads import ttl_minutes
from shared.storage import Database
from worker.upkeep.deletion import EXPIRED

log = structlog.get_logger(__name__)

#: Threads looked at per pass: a backlog drains a batch every few seconds, between runs.
BATCH = 20
#: How long a thread whose delete was queued, or that has a cron, waits before the next look (a
#: delete that failed is queued again then).
LATER_SECONDS = 30.0
#: How long an expired thread a run holds waits before the next look: it goes once the run ended.
HELD_SECONDS = 5.0

_UPDATED_SQL = "SELECT updated_at FROM conversations WHERE id = ?"
_CRON_SQL = "SELECT id FROM crons WHERE thread_id = ? LIMIT 1"


def _text(value: bytes | str | None) -> str | None:
    # The worker's client returns bytes (arq's pool does not decode).
    return value.decode() if isinstance(value, bytes) else value


class ThreadExpiry:
    def __init__(self, db: Database, redis: Redis) -> None:
        self.db = db
        self.redis = redis

    async def once(self, now: float | None = None) -> int:
        """Queue the delete of the threads due and expired; how many."""
        now = now if now is not None else time.time()
        due = await self.redis.zrangebyscore(
            PROTOCOL_THREAD_EXPIRY, "-inf", int(now * 1000), start=0, num=BATCH
        )
        queued = 0
        for raw in due:
            thread_id = _text(raw) or ""
            expired, next_look = await self._verdict(thread_id, now)
            if expired:
                if await self._expire(thread_id):
                    queued += 1
                else:  # held by a run: looked at again soon after it ends
                    next_look = now + HELD_SECONDS
            if next_look is None:
                await self.redis.zrem(PROTOCOL_THREAD_EXPIRY, thread_id)
            else:  # XX: a thread deleted meanwhile is not put back
                await self.redis.zadd(PROTOCOL_THREAD_EXPIRY, {thread_id: int(next_look * 1000)}, xx=True)
        return queued

    async def _verdict(self, thread_id: str, now: float) -> tuple[bool, float | None]:
        """Whether the thread has expired, and when to look at it again (None: no more, it is
        gone or a conversation without a ``ttl``). An expired thread is looked at again later
        too, in case its delete could not be queued or failed; its deletion drops it."""
        fields = await self.redis.hmget(protocol_thread_key(thread_id), ["created_at", "ttl"])  # type: ignore[misc]
        if fields[0] is None:
            return False, None
        ttl = ttl_minutes(fields[1])
        rows = await self.db.fetchall(_UPDATED_SQL, (thread_id,))
        if rows:
            if ttl is None:
                return False, None
            active_until = datetime.fromisoformat(str(rows[0][0])).timestamp() + 60.0 * ttl
            if active_until > now:
                return False, active_until
        elif await self.db.fetchall(_CRON_SQL, (thread_id,)):
            return False, now + LATER_SECONDS
        return True, now + LATER_SECONDS

    async def _expire(self, thread_id: str) -> bool:
        job = DeleteJob(thread_id, delete_claim(str(uuid.uuid4())), time.time(), EXPIRED)
        holder = await submit_delete(self.redis, job)
        if holder is not None:  # a run of it is queued or running, or its delete already is
            log.debug("thread.expiry_held", conversation_id=thread_id, holder=_text(holder))
            return False
        log.info("thread.expiring", conversation_id=thread_id, job_id=job.claim)
        return True
