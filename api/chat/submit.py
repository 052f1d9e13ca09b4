"""Accepting a message (or a resume) as a new run of a conversation: ``POST /api/chat`` and the
Agent Protocol's runs of a thread.

Checks follow the contract's order: message, resume needs a conversation, id
format, existence, active run, resumable. The JSON check comes before (see
api/chat/routes.py). Acceptance itself is one atomic script in Redis, behind the checks every
kind of run shares (api/chat/accept.py).

With an ``Idempotency-Key`` a retried request gets the first request's answer
(same conversation, same run) instead of a second run: the key is looked up
before the checks and again when they refuse (the first request may have been
accepted meanwhile), and the submit script stores the answer atomically with the
run. The same key with a different request is refused (422; api/chat/idempotency.py).

An edit or a regenerate (``replaces``, ``regenerate``) and a switch of branch are forks
(api/chat/forks.py); decisions on an approval, api/chat/decisions.py. A conversation that follows
a branch other than its newest runs its next message (or resume) from that branch's head.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import structlog

from api.chat.accept import Acceptance
from api.chat.decisions import decide
from api.chat.forks import fork
from api.chat.idempotency import idempotency_of, replay
from api.chat.schemas import ChatAccepted, ChatRequest
from api.http.ids import new_id, parse_id
from api.protocol.assistants.service import Assistants
from shared.contracts.assistants import AgentConfig
from shared.contracts.jobs import JobKind, RunJob
from shared.errors import (
    ApprovalPending,
    BadRequest,
    RunNotResumable,
    SessionInProgress,
)
from shared.redis.queue import Idempotency
from shared.storage.rows import title_of


@dataclass(frozen=True, slots=True)
class ChatService(Acceptance):
    """The runs ``POST /api/chat`` and the Agent Protocol ask for, on :class:`Acceptance`'s checks."""

    async def submit(self, request: ChatRequest, idempotency_key: str | None = None) -> ChatAccepted:
        """Validate ``request`` and enqueue its run; raise the contract's errors."""
        if request.decisions is not None:
            return await decide(self, request, idempotency_key)
        if request.replaces is not None or request.regenerate is not None:
            return await fork(self, request, idempotency_key)
        message = None if request.resume else self.message(request)
        if request.resume and request.conversation is None:
            raise BadRequest("resume needs a conversation")
        if request.conversation is None:
            conversation_id, new = new_id(), True
        else:
            conversation_id, new = parse_id(request.conversation, "conversation"), False
        agent = await self._assistant(request, new)
        idempotency = idempotency_of(idempotency_key, request, None if new else conversation_id)
        if (replayed := await replay(self.redis, idempotency)) is not None:
            return replayed
        try:
            return await self._submit(request, message, conversation_id, new, idempotency, agent=agent)
        except (SessionInProgress, RunNotResumable, ApprovalPending):
            # The first of several identical requests may have been accepted meanwhile.
            if (replayed := await replay(self.redis, idempotency)) is not None:
                return replayed
            raise

    async def _assistant(self, request: ChatRequest, new: bool) -> AgentConfig | None:
        """The agent of a new conversation begun with an assistant (None: config/'s, or the
        conversation's own: the worker finds it on the thread)."""
        if request.assistant is None:
            return None
        if not new:
            raise BadRequest("assistant is taken with a new conversation: a conversation keeps its own")
        return await Assistants(self.store, self.redis).agent_for_run(request.assistant, None, None)

    async def submit_to_thread(
        self, conversation_id: str, message: str | None, *, may_be_new: bool,
        checkpoint_id: str | None = None, enqueue: bool = False, agent: AgentConfig | None = None,
        command: dict[str, Any] | None = None, breakpoints: dict[str, Any] | None = None,
        after_seconds: float = 0.0,
    ) -> ChatAccepted:
        """A run of a conversation the caller names (the Agent Protocol's threads, api/protocol/):
        ``message``, or a resume when it is None; the same checks, in the same order, as
        :meth:`submit`. ``may_be_new``: the id may have no conversation yet (a thread created
        empty), and then this first run creates it. ``checkpoint_id``: the run starts there (a
        fork, api/protocol/runs/forks.py, which checked that checkpoint: a resume needs its tasks).
        ``enqueue``: on a busy conversation the run is accepted behind the run that holds it
        (shared/redis/queue.py), and the worker checks the thread again when its turn comes
        (worker/run/turns.py). ``command``: without a message, LangGraph's ``Command`` (``goto``,
        ``update``) is the run's input, which needs no step left to resume. ``breakpoints``: the
        nodes the run stops before or after (``interrupt_before``, ``interrupt_after``).
        ``after_seconds``: the run is due that much later (it holds the conversation meanwhile)."""
        request = ChatRequest(message=message, conversation=conversation_id, resume=message is None)
        if message is not None:
            self.message(request)
        return await self._submit(
            request, message, conversation_id, False, None, may_be_new=may_be_new,
            checkpoint_id=checkpoint_id, enqueue=enqueue, agent=agent, command=command,
            breakpoints=breakpoints, after_seconds=after_seconds,
        )

    async def _submit(
        self, request: ChatRequest, message: str | None, conversation_id: str, new: bool,
        idempotency: Idempotency | None, *, may_be_new: bool = False, checkpoint_id: str | None = None,
        enqueue: bool = False, agent: AgentConfig | None = None, command: dict[str, Any] | None = None,
        breakpoints: dict[str, Any] | None = None, after_seconds: float = 0.0,
    ) -> ChatAccepted:
        structlog.contextvars.bind_contextvars(conversation_id=conversation_id)
        title = title_of(message)

        head = None
        row = None
        if not new:
            row, holder = await self.open(conversation_id, may_be_new=may_be_new, enqueue=enqueue)
            # Behind a run, what the thread will hold is not known yet: the worker checks it.
            resumable = (
                checkpoint_id is not None or command is not None or (row is not None and row.pending_tasks)
            )
            if request.resume and holder is None and not resumable:
                raise RunNotResumable(f"conversation {conversation_id} has no unfinished run to resume")
            title = row.title if row is not None else title_of(message)
            # Only with may_be_new: the first run of a thread created empty. Not behind a run:
            # the thread will exist (and may wait for a decision) when this one starts.
            new = row is None and holder is None
            head = checkpoint_id or (row.branch_head if row is not None else None)

        now = time.time()
        job = RunJob(
            run_id=new_id(),
            conversation_id=conversation_id,
            kind=JobKind.RESUME if request.resume else JobKind.RUN,
            message=message,
            enqueued_at=now,
            new_conversation=new,
            checkpoint_id=head,  # the branch the conversation follows, when not the newest
            may_wait=enqueue,
            # None: the agent the thread's last run had (worker/run/service.py), or config/'s
            agent=agent,
            command=command,
            breakpoints=breakpoints,
            due_at=now + after_seconds if after_seconds > 0 else None,
        )
        return await self.enqueue(
            job, title, message, new, idempotency, enqueue=enqueue, owner=row.owner if row else None
        )

    async def update_state(
        self, conversation_id: str, values: dict[str, Any], as_node: str | None
    ) -> ChatAccepted:
        """Write ``values`` into the thread's state as ``as_node`` would (the Agent Protocol's
        ``update_state``): a run of kind ``update``, through the same checks, claim and queue
        (a busy conversation is 409, as for a message). A thread created empty takes it too."""
        structlog.contextvars.bind_contextvars(conversation_id=conversation_id)
        row, _ = await self.open(conversation_id, may_be_new=True)
        job = RunJob(
            run_id=new_id(), conversation_id=conversation_id, kind=JobKind.UPDATE, message=None,
            enqueued_at=time.time(), new_conversation=row is None,
            checkpoint_id=row.branch_head if row is not None else None,
            update={"values": values, "as_node": as_node},
        )
        title = row.title if row is not None else title_of(None)
        return await self.enqueue(job, title, None, row is None, None, owner=row.owner if row else None)
