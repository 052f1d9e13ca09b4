"""Forks and switches of a conversation's branches: an edit (``replaces``) or a regenerate is a
message run forked from the checkpoint that received the user message it names; a switch (and the
Agent Protocol's rollback) is a run of kind ``switch`` that records the branch the conversation
follows from then on (api/chat/branches.py reads the thread for both).
"""

from __future__ import annotations

import functools
import time

import structlog

from api.chat import branches
from api.chat.accept import Acceptance
from api.chat.idempotency import idempotency_of, replay
from api.chat.schemas import ChatAccepted, ChatRequest
from api.http.ids import new_id, parse_id
from api.store import ConversationRow
from shared.contracts.jobs import JobKind, RunJob
from shared.errors import (
    ApprovalPending,
    BadRequest,
    NotForkable,
    NotFound,
    SessionInProgress,
)

log = structlog.get_logger(__name__)


async def fork(chat: Acceptance, request: ChatRequest, idempotency_key: str | None) -> ChatAccepted:
    """An edit (``replaces``) or a regenerate: a message run from where the thread received
    the user message named, leaving the branch after it as an alternative."""
    edit = request.replaces is not None
    if edit and request.regenerate is not None:
        raise BadRequest("replaces and regenerate do not go together: send one")
    message = chat.message(request) if edit else None
    if not edit and request.message is not None:
        raise BadRequest("regenerate takes no message: it answers the same user message again")
    if request.resume:
        raise BadRequest("an edit or a regenerate is not a resume: leave resume out")
    if request.conversation is None:
        raise BadRequest(f"{'replaces' if edit else 'regenerate'} needs a conversation")
    conversation_id = parse_id(request.conversation, "conversation")
    target = request.replaces if request.replaces is not None else request.regenerate or ""
    idempotency = idempotency_of(idempotency_key, request, conversation_id)
    if (replayed := await replay(chat.redis, idempotency)) is not None:
        return replayed
    structlog.contextvars.bind_contextvars(conversation_id=conversation_id)
    try:
        row = await chat.existing(conversation_id)
        planned = functools.partial(branches.plan, target, edit)
        plan = await chat.store.read_thread(conversation_id, planned)
        if plan is None or plan == branches.MISSING:
            raise NotFound(
                f"message {target[:80]!r} is not on the current branch of conversation {conversation_id}"
            )
        if plan == branches.PRUNED:
            raise NotForkable(
                f"message {target[:80]!r} is older than the checkpoints its branch keeps (old "
                "checkpoints were pruned): it can no longer be edited or answered again"
            )
        if plan == branches.NOT_USER:
            raise NotForkable(
                f"message {target[:80]!r} is not a user message: only the user's messages can be edited "
                "(ask for another answer with regenerate)"
            )
        if not isinstance(plan, branches.Plan):
            raise NotForkable(
                f"no user message comes before message {target[:80]!r}: nothing to answer again"
            )
        job = RunJob(
            run_id=new_id(), conversation_id=conversation_id, kind=JobKind.RUN,
            message=message if message is not None else plan.content, enqueued_at=time.time(),
            checkpoint_id=plan.checkpoint,
        )
        accepted = await chat.enqueue(job, row.title, job.message, False, idempotency, owner=row.owner)
    except (SessionInProgress, ApprovalPending):
        # The first of several identical requests may have been accepted meanwhile.
        if (replayed := await replay(chat.redis, idempotency)) is not None:
            return replayed
        raise
    abandoned = branches.acting(plan.abandoned, await chat.store.tool_calls(conversation_id))
    log.info("run.forked", edit=edit, abandoned_calls=len(abandoned))
    if abandoned:
        accepted.abandoned_calls = abandoned
    return accepted


async def switch(chat: Acceptance, conversation_id: str, message_id: str) -> ChatAccepted:
    """Follow the branch that starts with ``message_id`` (at a fork point of the current
    branch) from now on: a run of kind ``switch``, in which the worker records it."""
    structlog.contextvars.bind_contextvars(conversation_id=conversation_id)
    row = await chat.existing(conversation_id)
    target = functools.partial(branches.switch_target, message_id)
    head = await chat.store.read_thread(conversation_id, target)
    if head is None:
        raise NotFound(
            f"no branch of conversation {conversation_id} starts with message {message_id[:80]!r} "
            "at a fork of its current branch"
        )
    return await follow(chat, conversation_id, head, row)


async def follow(
    chat: Acceptance, conversation_id: str, checkpoint_id: str, row: ConversationRow | None = None
) -> ChatAccepted:
    """Make the branch whose head is ``checkpoint_id`` the one the conversation follows: a run
    of kind ``switch`` (a rollback's too, api/protocol/runs/forks.py, which checked the checkpoint)."""
    if row is None:
        row = await chat.existing(conversation_id)
    job = RunJob(
        run_id=new_id(), conversation_id=conversation_id, kind=JobKind.SWITCH, message=None,
        enqueued_at=time.time(), checkpoint_id=checkpoint_id,
    )
    return await chat.enqueue(job, row.title, None, False, None, owner=row.owner)

