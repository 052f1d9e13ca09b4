"""``POST /threads/{id}/copy`` (the SDK's ``threads.copy``): a new thread, the caller's, holding
the thread's history, so its state and history read the same and a run on it goes on from there
without touching the source.

The API never writes the database: it checks the source is the caller's (404 otherwise, as
everywhere: api/auth/scope.py) and that no run holds it (409 ``SESSION_IN_PROGRESS``: a run
would be writing the checkpoints being copied), writes the copy's thread record with the
source's metadata as ``POST /threads`` does, and enqueues a copy job: the worker copies the
checkpoints through LangGraph's saver and then the conversation's row
(worker/upkeep/threadcopy.py). As a rename does (api/conversations/renaming.py), the request
waits up to :data:`COPY_WAIT_SECONDS` for the worker's word; past it the copy answers as an
empty thread until the worker, busy or down, has copied it. A thread with no conversation yet
(created empty) is copied by its record alone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import structlog

from api.auth.scope import owner_for_new
from api.http.ids import new_id
from api.protocol.threads.found import settable
from api.protocol.threads.service import Threads
from shared.contracts.jobs import CopyJob, is_delete_claim
from shared.errors import DatabaseUnavailable, NotFound, SessionInProgress
from shared.redis.keys import ACTIVE_RUNS, copied_key
from shared.redis.outcomes import awaited
from shared.redis.queue import submit_copy
from shared.redis.threads import forget_thread

log = structlog.get_logger(__name__)

#: How long a copy waits for the worker before answering (the job stays queued).
COPY_WAIT_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class Copies:
    threads: Threads
    wait_seconds: float = COPY_WAIT_SECONDS

    async def copy(self, thread_id: str) -> dict[str, Any]:
        """Copy the thread; the copy (the SDK's ``Thread``)."""
        redis = self.threads.redis
        found = await self.threads.find(thread_id)
        holder = await redis.hget(ACTIVE_RUNS, thread_id)  # type: ignore[misc]
        if holder is not None and is_delete_claim(holder):
            raise NotFound(f"thread {thread_id} is being deleted")
        if holder is not None:
            raise SessionInProgress(
                f"thread {thread_id} has a run in progress ({holder}); copy it once the run has ended"
            )
        copy_id = new_id()
        await self.threads.records.claim(copy_id, settable(found.metadata))
        if found.info is not None:
            job = CopyJob(thread_id, copy_id, owner_for_new(), f"copy:{new_id()}", time.time())
            await submit_copy(redis, job)
            log.info("thread.copy_accepted", conversation_id=thread_id, copy_id=copy_id, job_id=job.job_id)
            await self._done(thread_id, copy_id, job.job_id)
            await self.threads.records.ran(copy_id, owner_for_new())
        return await self.threads.get(copy_id)

    async def _done(self, thread_id: str, copy_id: str, job_id: str) -> None:
        redis = self.threads.redis
        outcome = await awaited(redis, copied_key(job_id), self.wait_seconds)
        if outcome is None or outcome == "copied":
            return
        # Nothing to copy after all: the copy's record goes, so no empty thread is left behind.
        async with redis.pipeline(transaction=True) as pipe:
            forget_thread(pipe, copy_id, owner_for_new())
            await pipe.execute()
        if outcome == "gone":
            raise NotFound(f"thread {thread_id} was deleted before it was copied")
        raise DatabaseUnavailable(f"the worker could not copy thread {thread_id} ({outcome}); try again")
