"""Accepting a run of a conversation: the checks every kind of run shares, and its one submit.

Every run (a message, a resume, a fork, a switch, a decision, a state update) is accepted the
same way: the conversation must exist (or may be new), hold no run (unless the run is queued
behind it) and wait for no decision; then one atomic script in Redis
(:func:`shared.redis.queue.submit`) claims the conversation, counts the owner's active runs,
stores an idempotent answer and queues the job, so a failure leaves nothing half-recorded and
two simultaneous requests for one conversation cannot both be accepted.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import structlog
from redis.asyncio import Redis

from api.auth.identity import caller
from api.auth.scope import active_run_limit
from api.chat.idempotency import answer
from api.chat.schemas import ChatAccepted, ChatRequest
from api.runs import live
from api.runs.status import waits_for_decision
from api.store import ConversationRow, Store
from shared import tracing
from shared.contracts.jobs import RunJob
from shared.errors import (
    ApprovalPending,
    BadRequest,
    NotFound,
    SessionInProgress,
    TooManyActiveRuns,
)
from shared.redis.queue import Idempotency, submit
from shared.settings import Settings

log = structlog.get_logger(__name__)

#: ``Retry-After`` of a run refused by ``USER_MAX_ACTIVE_RUNS``: when one of the user's runs ends
#: is not known; most runs of a chat take seconds.
ACTIVE_RUNS_RETRY_SECONDS = 5


def busy(conversation_id: str, holder: str) -> SessionInProgress:
    """The refusal of a run on a conversation ``holder`` holds."""
    return SessionInProgress(f"conversation {conversation_id} already has a run in progress ({holder})")


@dataclass(frozen=True, slots=True)
class Acceptance:
    """The checks and the submit every kind of run goes through (api/chat/submit.py, forks.py,
    decisions.py)."""

    settings: Settings
    store: Store
    redis: Redis

    def message(self, request: ChatRequest) -> str:
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

    async def free(self, conversation_id: str, *, may_be_new: bool = False) -> ConversationRow | None:
        """The conversation's row, once it is known to exist, to hold no run and to wait for no decision."""
        return (await self.open(conversation_id, may_be_new=may_be_new))[0]

    async def open(
        self, conversation_id: str, *, may_be_new: bool = False, enqueue: bool = False
    ) -> tuple[ConversationRow | None, str | None]:
        """:meth:`free`'s checks and the run holding the conversation: with ``enqueue`` a held
        conversation is no refusal (the run will wait behind the holder)."""
        # The claim first, then the row: a run records its outcome before it frees the
        # claim (worker/run/outcome/ending.py), so a row read after a free claim is that run's
        # outcome. Read the other way round, a run turning `waiting` in between would
        # let a message through over its approval.
        holder = await live.active_run(self.redis, conversation_id)
        row = await self.store.conversation(conversation_id)
        if row is None and holder is None and not may_be_new:
            raise NotFound(f"conversation {conversation_id} not found")
        if holder is not None and not enqueue:
            raise busy(conversation_id, holder)
        if waits_for_decision(row, holder):
            raise ApprovalPending(
                f"conversation {conversation_id} waits for a decision on its tool calls; "
                "send the decisions first"
            )
        return row, holder

    async def existing(self, conversation_id: str) -> ConversationRow:
        row = await self.free(conversation_id)
        if row is None:  # its first run was accepted and is not recorded yet: it is queued
            raise NotFound(f"conversation {conversation_id} not found")
        return row

    async def enqueue(
        self, job: RunJob, title: str, message: str | None, new: bool, idempotency: Idempotency | None,
        *, enqueue: bool = False, owner: str | None = None,
    ) -> ChatAccepted:
        # Whose run it is: the conversation's owner (a new one's: the caller); who asked for it.
        job = dataclasses.replace(job, owner=owner or caller().name, started_by=caller().name)
        conversation_id = job.conversation_id
        with tracing.span("enqueue run", {
            "sophos.run.id": job.run_id, "sophos.conversation.id": conversation_id,
            "sophos.run.kind": job.kind.value, "messaging.system": "arq", "messaging.operation.type": "send",
        }, kind="producer"):
            # The worker continues this trace from the job (shared/tracing.py).
            job = dataclasses.replace(job, traceparent=tracing.traceparent())
            limit = active_run_limit(self.settings.user_max_active_runs)
            submitted = await submit(
                self.redis, job, title=title, idempotency=idempotency, enqueue=enqueue, limit=limit,
            )
        if submitted.first is not None and idempotency is not None:
            return answer(submitted.first, idempotency)
        if submitted.active is not None:
            log.warning("limit.active_runs", owner=job.owner, active=submitted.active, limit=limit)
            raise TooManyActiveRuns(
                f"{job.owner} has {submitted.active} runs queued or running, the most a user may have "
                f"(USER_MAX_ACTIVE_RUNS={limit}); retry when one ends",
                retry_after=ACTIVE_RUNS_RETRY_SECONDS,
            )
        # A holder equal to our own run id means a retried script had already run.
        if submitted.holder is not None and submitted.holder != job.run_id:
            raise busy(conversation_id, submitted.holder)
        structlog.contextvars.bind_contextvars(run_id=job.run_id, job_id=job.run_id)  # arq job id = run id
        log.info("run.accepted", kind=job.kind.value, new_conversation=new,
                 **({"behind": submitted.behind} if submitted.behind is not None else {}),
                 **({"message": message} if self.settings.log_content else {}))
        return ChatAccepted(conversation=conversation_id, run=job.run_id)
