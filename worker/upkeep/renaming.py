"""Renaming a conversation: write its title, then tell the API waiting on it (persist, then notify).

The API validated the title and enqueued the job (api/conversations/renaming.py). Writing the same title
twice is harmless, so a second delivery does what the first did.
"""

from __future__ import annotations

from typing import Any

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

from shared.contracts.jobs import RenameJob
from shared.redis.keys import renamed_key
from worker.entry import entry_point
from worker.store import RunStore

log = structlog.get_logger(__name__)

#: How long the outcome of a rename is kept for the API requests waiting on it.
OUTCOME_TTL_SECONDS = 60


async def rename(store: RunStore, redis: Redis, job: RenameJob) -> str:
    outcome = "failed: the worker stopped"
    try:
        found = await store.rename_conversation(job.conversation_id, job.title)
        outcome = "renamed" if found else "gone"
        log.info("conversation.renamed" if found else "conversation.rename_gone")
    except Exception as exc:
        outcome = f"failed: {type(exc).__name__}: {exc}"
        log.exception("conversation.rename_failed")
    finally:
        await _notify(redis, job, outcome)
    return outcome


async def _notify(redis: Redis, job: RenameJob, outcome: str) -> None:
    key = renamed_key(job.job_id)
    try:
        async with redis.pipeline(transaction=True) as pipe:
            pipe.rpush(key, outcome)
            pipe.expire(key, OUTCOME_TTL_SECONDS)
            await pipe.execute()
    except RedisError as exc:  # the API answered 202 already, or will: the title is written
        log.warning("conversation.rename_notify_failed", error=str(exc))


@entry_point(RenameJob)
async def rename_job(ctx: dict[str, Any], job: RenameJob) -> str:
    """arq's entry point."""
    return await rename(ctx["store"], ctx["redis"], job)
