"""``DELETE /api/conversations/{id}``: claim the conversation, enqueue a delete job, wait briefly.

The API never writes the database: the worker deletes (worker/upkeep/deletion.py). The
request claims the conversation in ``ACTIVE_RUNS`` with a delete claim and
enqueues the job in one script, exactly as a submission claims it for a run
(shared/redis/queue.py): a delete and a run of one conversation exclude each other,
whichever comes first, across every API process. A run queued or running → 409.

The answer then waits up to :data:`DELETE_WAIT_SECONDS` for the worker's word
(a ``BLPOP`` on the delete's outcome list, no polling): 204 when it has deleted
the conversation, else 202, the job staying queued (the worker is busy with
another run, or down) until the worker takes it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum

import structlog
from redis.asyncio import Redis

from api.http.ids import new_id
from api.store import Store
from shared.contracts.jobs import DeleteJob, delete_claim, is_delete_claim
from shared.errors import DatabaseUnavailable, NotFound, SessionInProgress
from shared.redis.keys import ACTIVE_RUNS, deleted_key
from shared.redis.outcomes import OUTCOME_TTL_SECONDS, awaited
from shared.redis.queue import submit_delete

log = structlog.get_logger(__name__)

#: How long DELETE waits for the worker before answering 202 (the job stays queued).
DELETE_WAIT_SECONDS = 3.0

class Deleted(Enum):
    DONE = "done"  # 204
    ACCEPTED = "accepted"  # 202: the worker deletes it when it takes the job


@dataclass(frozen=True, slots=True)
class Deletions:
    store: Store
    redis: Redis
    wait_seconds: float = DELETE_WAIT_SECONDS

    async def delete(self, conversation_id: str) -> Deleted:
        row = await self.store.conversation(conversation_id)
        job = DeleteJob(conversation_id, delete_claim(new_id()), time.time())
        holder: str | None
        if row is None:
            # Known only to Redis: its first run is queued (409), or a delete of it is under way.
            holder = await self.redis.hget(ACTIVE_RUNS, conversation_id)  # type: ignore[misc]
            if holder is None:
                raise NotFound(f"conversation {conversation_id} not found")
        else:
            holder = await submit_delete(self.redis, job)
        if holder is not None and not is_delete_claim(holder):
            raise SessionInProgress(
                f"conversation {conversation_id} has a run queued or running ({holder}); "
                "cancel it or wait for it to end, then delete"
            )
        claim = holder or job.claim
        if holder is None:
            log.info("conversation.delete_accepted", job_id=claim)
        return await self._outcome(conversation_id, claim)

    async def _outcome(self, conversation_id: str, claim: str) -> Deleted:
        """Wait (bounded) for the worker's outcome of the delete holding ``claim``."""
        key = deleted_key(claim)
        # BLPOP then push back: every request waiting on this delete gets its outcome.
        outcome = await awaited(self.redis, key, self.wait_seconds)
        if outcome is None:
            return Deleted.ACCEPTED
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.lpush(key, outcome)
            pipe.expire(key, OUTCOME_TTL_SECONDS)
            await pipe.execute()
        if outcome != "deleted":
            raise DatabaseUnavailable(
                f"the worker could not delete conversation {conversation_id} ({outcome}); try again"
            )
        return Deleted.DONE
