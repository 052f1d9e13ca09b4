"""Renaming a conversation: write its title, then tell the API waiting on it (persist, then notify).

The API validated the title and enqueued the job (api/conversations/renaming.py). Writing the same title
twice is harmless, so a second delivery does what the first did.
"""

from __future__ import annotations

from typing import Any

import structlog
from redis.asyncio import Redis

from shared.contracts.jobs import RenameJob
from shared.redis.keys import renamed_key
from shared.redis.outcomes import STOPPED, failure, report
from worker.entry import entry_point
from worker.store import RunStore

log = structlog.get_logger(__name__)



async def rename(store: RunStore, redis: Redis, job: RenameJob) -> str:
    outcome = STOPPED
    try:
        found = await store.rename_conversation(job.conversation_id, job.title)
        outcome = "renamed" if found else "gone"
        log.info("conversation.renamed" if found else "conversation.rename_gone")
    except Exception as exc:
        outcome = failure(exc)
        log.exception("conversation.rename_failed")
    finally:
        await report(redis, renamed_key(job.job_id), outcome, event="conversation.rename_notify_failed")
    return outcome


@entry_point(RenameJob)
async def rename_job(ctx: dict[str, Any], job: RenameJob) -> str:
    """arq's entry point."""
    return await rename(ctx["store"], ctx["redis"], job)
