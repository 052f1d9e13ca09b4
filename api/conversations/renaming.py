"""``PATCH /api/conversations/{id}``: validate a title, enqueue a rename job, wait briefly.

The API never writes the database: the worker renames (worker/upkeep/renaming.py). As a delete
does (api/conversations/deletion.py), the request waits up to :data:`RENAME_WAIT_SECONDS` for the
worker's word (a ``BLPOP`` on the job's outcome list): done, or accepted, the job staying
queued until the worker takes it (it is busy with a run, or down). A refused rename
(bad title, unknown conversation) enqueues nothing.
"""

from __future__ import annotations

import time
import unicodedata
from dataclasses import dataclass

import structlog
from redis.asyncio import Redis

from api.http.ids import new_id
from api.store import Store
from shared.contracts.jobs import TITLE_MAX_CHARS, RenameJob, is_delete_claim
from shared.errors import DatabaseUnavailable, InvalidTitle, NotFound, SessionInProgress
from shared.redis.keys import ACTIVE_RUNS, renamed_key
from shared.redis.outcomes import awaited
from shared.redis.queue import submit_rename

log = structlog.get_logger(__name__)

#: How long a rename waits for the worker before answering 202 (the job stays queued).
RENAME_WAIT_SECONDS = 3.0


def clean_title(title: str) -> str:
    """``title`` with its runs of whitespace (newlines too) made single spaces, or InvalidTitle:
    blank, too long, or with a control character."""
    cleaned = " ".join(title.split())
    if not cleaned:
        raise InvalidTitle("title must not be empty or only whitespace")
    if len(cleaned) > TITLE_MAX_CHARS:
        raise InvalidTitle(f"title must be at most {TITLE_MAX_CHARS} characters, got {len(cleaned)}")
    if has_control_characters(cleaned):
        # NUL among them: PostgreSQL's text refuses it, and none is anything to show.
        raise InvalidTitle("title must not contain control characters")
    return cleaned


def has_control_characters(text: str) -> bool:
    return any(unicodedata.category(c) == "Cc" for c in text)


@dataclass(frozen=True, slots=True)
class Renames:
    store: Store
    redis: Redis
    wait_seconds: float = RENAME_WAIT_SECONDS

    async def rename(self, conversation_id: str, title: str) -> tuple[str, bool]:
        """Enqueue the rename; return the title given and whether the worker has written it."""
        cleaned = clean_title(title)
        holder = await self.redis.hget(ACTIVE_RUNS, conversation_id)  # type: ignore[misc]
        if holder is not None and is_delete_claim(holder):
            raise NotFound(f"conversation {conversation_id} is being deleted")
        if await self.store.conversation(conversation_id) is None:
            if holder is None:
                raise NotFound(f"conversation {conversation_id} not found")
            # Its first run is queued: no row to rename until the worker starts it.
            raise SessionInProgress(
                f"conversation {conversation_id} has not started yet ({holder}); rename it once it has"
            )
        job = RenameJob(conversation_id, cleaned, f"rename:{new_id()}", time.time())
        await submit_rename(self.redis, job)
        log.info("conversation.rename_accepted", job_id=job.job_id)
        return cleaned, await self._done(conversation_id, job.job_id)

    async def _done(self, conversation_id: str, job_id: str) -> bool:
        outcome = await awaited(self.redis, renamed_key(job_id), self.wait_seconds)
        if outcome is None:
            return False
        if outcome == "gone":
            raise NotFound(f"conversation {conversation_id} was deleted before it was renamed")
        if outcome != "renamed":
            raise DatabaseUnavailable(
                f"the worker could not rename conversation {conversation_id} ({outcome}); try again"
            )
        return True
