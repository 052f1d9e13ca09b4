"""Accepting a message (or a resume) as a new run of a conversation.

Checks follow the contract's order: message, resume needs a conversation, id
format, existence, active run, resumable. The JSON check comes before (see
routes_chat). Acceptance itself is one atomic script in Redis
(:func:`shared.queue.submit_run`), so a failure leaves nothing half-recorded and
two simultaneous requests for one conversation cannot both be accepted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import structlog
from redis.asyncio import Redis

from api import live
from api.ids import new_id, parse_id
from api.schemas import ChatAccepted, ChatRequest
from api.store import Store
from shared.contracts import JobKind, RunJob
from shared.errors import BadRequest, NotFound, RunNotResumable, SessionInProgress
from shared.queue import submit_run
from shared.settings import Settings

log = structlog.get_logger(__name__)

TITLE_CHARS = 80


def title_of(message: str) -> str:
    """First line of the first message, at most 80 characters (as the worker does)."""
    stripped = message.strip()
    return stripped.splitlines()[0][:TITLE_CHARS] if stripped else "New conversation"


def _busy(conversation_id: str, holder: str) -> SessionInProgress:
    return SessionInProgress(f"conversation {conversation_id} already has a run in progress ({holder})")


@dataclass(frozen=True, slots=True)
class ChatService:
    settings: Settings
    store: Store
    redis: Redis

    def _message(self, request: ChatRequest) -> str:
        message = request.message
        if message is None or not message.strip():
            raise BadRequest("message must be a non-empty string")
        if len(message) > self.settings.max_message_chars:
            raise BadRequest(
                f"message is longer than {self.settings.max_message_chars} characters ({len(message)})"
            )
        if "\x00" in message:
            raise BadRequest("message must not contain NUL characters")
        return message

    async def submit(self, request: ChatRequest) -> ChatAccepted:
        """Validate ``request`` and enqueue its run; raise the contract's errors."""
        message = None if request.resume else self._message(request)
        if request.resume and request.conversation is None:
            raise BadRequest("resume needs a conversation")
        if request.conversation is None:
            conversation_id, title, new = new_id(), title_of(message or ""), True
        else:
            conversation_id, new = parse_id(request.conversation, "conversation"), False
        structlog.contextvars.bind_contextvars(conversation_id=conversation_id)

        if not new:
            row = await self.store.conversation(conversation_id)
            holder = await live.active_run(self.redis, conversation_id)
            if row is None and holder is None:
                raise NotFound(f"conversation {conversation_id} not found")
            if holder is not None:
                raise _busy(conversation_id, holder)
            if request.resume and (row is None or not row.pending_tasks):
                raise RunNotResumable(f"conversation {conversation_id} has no unfinished run to resume")
            title = row.title if row is not None else title_of(message or "")

        job = RunJob(
            run_id=new_id(),
            conversation_id=conversation_id,
            kind=JobKind.RESUME if request.resume else JobKind.RUN,
            message=message,
            enqueued_at=time.time(),
            new_conversation=new,
        )
        holder = await submit_run(self.redis, job, title=title)
        # A holder equal to our own run id means a retried script had already run.
        if holder is not None and holder != job.run_id:
            raise _busy(conversation_id, holder)
        structlog.contextvars.bind_contextvars(run_id=job.run_id, job_id=job.run_id)  # arq job id = run id
        log.info("run.accepted", kind=job.kind.value, new_conversation=new,
                 **({"message": message} if self.settings.log_content else {}))
        return ChatAccepted(conversation=conversation_id, run=job.run_id)
