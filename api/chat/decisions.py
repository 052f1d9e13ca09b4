"""Decisions on the tool calls a conversation waits on (``{conversation, decisions}``): their
shape is checked first (400), then the conversation's existence, then that it waits (409
NO_APPROVAL_PENDING; a run in progress for it means the approval is already being acted on), then
that every pending request, read from the thread's checkpoint, has exactly one decision (400).
"""

from __future__ import annotations

import time

import structlog

from api.chat.accept import Acceptance
from api.chat.approvals import check_shape, match, pending_requests
from api.chat.idempotency import idempotency_of, replay
from api.chat.schemas import ChatAccepted, ChatRequest
from api.http.ids import new_id, parse_id
from api.runs import live
from api.runs.status import waits_for_decision
from shared.contracts.jobs import JobKind, RunJob
from shared.errors import (
    BadRequest,
    NoApprovalPending,
    NotFound,
    SessionInProgress,
)


async def decide(chat: Acceptance, request: ChatRequest, idempotency_key: str | None) -> ChatAccepted:
    """Continue the conversation waiting on an approval with ``request.decisions``; the contract's errors."""
    if request.conversation is None:
        raise BadRequest("decisions need a conversation")
    if request.message is not None or request.resume:
        raise BadRequest("decisions come alone: no message, no resume")
    conversation_id = parse_id(request.conversation, "conversation")
    decisions = request.decisions or []
    check_shape(decisions)
    idempotency = idempotency_of(idempotency_key, request, conversation_id)
    if (replayed := await replay(chat.redis, idempotency)) is not None:
        return replayed
    try:
        structlog.contextvars.bind_contextvars(conversation_id=conversation_id)
        holder = await live.active_run(chat.redis, conversation_id)  # then the row (see Acceptance.open)
        row = await chat.store.conversation(conversation_id)
        if row is None and holder is None:
            raise NotFound(f"conversation {conversation_id} not found")
        if row is None or not waits_for_decision(row, holder):
            raise NoApprovalPending(f"conversation {conversation_id} has no approval pending")
        requests = await chat.store.read_thread(conversation_id, pending_requests)
        if requests is None:
            raise NoApprovalPending(f"conversation {conversation_id} has no approval pending")
        job = RunJob(
            run_id=new_id(), conversation_id=conversation_id, kind=JobKind.DECIDE, message=None,
            enqueued_at=time.time(), decisions=match(decisions, requests),
        )
        return await chat.enqueue(job, row.title, None, False, idempotency, owner=row.owner)
    except (SessionInProgress, NoApprovalPending):
        # The first of several identical requests may have been accepted meanwhile.
        if (replayed := await replay(chat.redis, idempotency)) is not None:
            return replayed
        raise

