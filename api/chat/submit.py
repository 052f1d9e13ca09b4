"""Accepting a message (or a resume) as a new run of a conversation.

Checks follow the contract's order: message, resume needs a conversation, id
format, existence, active run, resumable. The JSON check comes before (see
api/chat/routes.py). Acceptance itself is one atomic script in Redis
(:func:`shared.redis.queue.submit_run`), so a failure leaves nothing half-recorded and
two simultaneous requests for one conversation cannot both be accepted.

With an ``Idempotency-Key`` a retried request gets the first request's answer
(same conversation, same run) instead of a second run: the key is looked up
before the checks and again when they refuse (the first request may have been
accepted meanwhile), and the submit script stores the answer atomically with the
run. The same key with a different request is refused (422).

An edit (``{conversation, message, replaces}``) or a regenerate (``{conversation,
regenerate}``) is a message run forked from the checkpoint that received the user message it
names (api/chat/branches.py): the same checks, then the message must be on the conversation's current
branch (404; 422 NOT_FORKABLE for an edit of a message that is not the user's). A switch
(``POST /api/conversations/{id}/branch``) is a run of kind ``switch``, checked the same way: the
worker records the branch as the one the conversation follows. A conversation that follows a
branch other than its newest runs its next message (or resume) from that branch's head.

Decisions (``{conversation, decisions}``) continue a conversation that waits for
an approval: their shape is checked first (400), then the conversation's
existence, then that it waits (409 NO_APPROVAL_PENDING; a run in progress for
it means the approval is already being acted on), then that every pending
request, read from the thread's checkpoint, has exactly one decision (400).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re
import time
from dataclasses import dataclass
from typing import Any

import structlog
from redis.asyncio import Redis

from api.auth.identity import caller
from api.chat import branches
from api.chat.approvals import check_shape, match, pending_requests
from api.chat.idempotency import first_answer  # refuses an answer naming a deleted conversation
from api.chat.schemas import ChatAccepted, ChatRequest
from api.http.ids import new_id, parse_id
from api.protocol.assistants import Assistants
from api.runs import live
from api.runs.status import waits_for_decision
from api.store import ConversationRow, Store
from shared import tracing
from shared.contracts.assistants import AgentConfig
from shared.contracts.jobs import JobKind, RunJob
from shared.errors import (
    ApprovalPending,
    BadRequest,
    IdempotencyKeyReused,
    NoApprovalPending,
    NotForkable,
    NotFound,
    RunNotResumable,
    SessionInProgress,
    TooManyActiveRuns,
)
from shared.redis.queue import FirstAnswer, Idempotency, submit
from shared.settings import Settings
from shared.storage.rows import title_of

log = structlog.get_logger(__name__)

#: Visible ASCII, as the header's draft standard suggests (a UUID fits easily).
_IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,255}")


def idempotency_of(key: str | None, request: ChatRequest, conversation_id: str | None) -> Idempotency | None:
    """The request's idempotency key, checked, with a fingerprint of what it asks for."""
    if key is None:
        return None
    if not _IDEMPOTENCY_KEY.fullmatch(key):
        raise BadRequest("Idempotency-Key must be 1 to 255 visible ASCII characters")
    fields: list[Any] = [request.message, conversation_id, request.resume]
    if request.decisions is not None:  # a message or resume fingerprints as it always did
        fields.append([[d.id, d.action, d.arguments, d.message] for d in request.decisions])
    if request.replaces is not None or request.regenerate is not None:
        fields.append(["fork", request.replaces, request.regenerate])
    asked = json.dumps(fields, ensure_ascii=False)
    # A key is its user's: another user's same key is another key (and reveals nothing).
    return Idempotency(key, hashlib.sha256(asked.encode()).hexdigest(), owner=caller().name)


def _answer(first: FirstAnswer, idempotency: Idempotency) -> ChatAccepted:
    if first.fingerprint != idempotency.fingerprint:
        raise IdempotencyKeyReused(
            "this Idempotency-Key was already used for a different request; use a new key"
        )
    log.info("run.idempotent_replay", run_id=first.run)
    return ChatAccepted(conversation=first.conversation, run=first.run)


def _busy(conversation_id: str, holder: str) -> SessionInProgress:
    return SessionInProgress(f"conversation {conversation_id} already has a run in progress ({holder})")


#: ``Retry-After`` of a run refused by ``USER_MAX_ACTIVE_RUNS``: when one of the user's runs ends
#: is not known; most runs of a chat take seconds.
ACTIVE_RUNS_RETRY_SECONDS = 5


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

    async def submit(self, request: ChatRequest, idempotency_key: str | None = None) -> ChatAccepted:
        """Validate ``request`` and enqueue its run; raise the contract's errors."""
        if request.decisions is not None:
            return await self._decide(request, idempotency_key)
        if request.replaces is not None or request.regenerate is not None:
            return await self._fork(request, idempotency_key)
        message = None if request.resume else self._message(request)
        if request.resume and request.conversation is None:
            raise BadRequest("resume needs a conversation")
        if request.conversation is None:
            conversation_id, new = new_id(), True
        else:
            conversation_id, new = parse_id(request.conversation, "conversation"), False
        agent = await self._assistant(request, new)
        idempotency = idempotency_of(idempotency_key, request, None if new else conversation_id)
        if idempotency is not None and (first := await first_answer(self.redis, idempotency)):
            return _answer(first, idempotency)
        try:
            return await self._submit(request, message, conversation_id, new, idempotency, agent=agent)
        except (SessionInProgress, RunNotResumable, ApprovalPending):
            # The first of several identical requests may have been accepted meanwhile.
            if idempotency is not None and (first := await first_answer(self.redis, idempotency)):
                return _answer(first, idempotency)
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
        fork, api/protocol/forks.py, which checked that checkpoint: a resume needs its tasks).
        ``enqueue``: on a busy conversation the run is accepted behind the run that holds it
        (shared/redis/queue.py), and the worker checks the thread again when its turn comes
        (worker/run/turns.py). ``command``: without a message, LangGraph's ``Command`` (``goto``,
        ``update``) is the run's input, which needs no step left to resume. ``breakpoints``: the
        nodes the run stops before or after (``interrupt_before``, ``interrupt_after``).
        ``after_seconds``: the run is due that much later (it holds the conversation meanwhile)."""
        request = ChatRequest(message=message, conversation=conversation_id, resume=message is None)
        if message is not None:
            self._message(request)
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
            row, holder = await self._open(conversation_id, may_be_new=may_be_new, enqueue=enqueue)
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
        return await self._enqueue(
            job, title, message, new, idempotency, enqueue=enqueue, owner=row.owner if row else None
        )

    async def _free(self, conversation_id: str, *, may_be_new: bool = False) -> ConversationRow | None:
        """The conversation's row, once it is known to exist, to hold no run and to wait for no decision."""
        return (await self._open(conversation_id, may_be_new=may_be_new))[0]

    async def _open(
        self, conversation_id: str, *, may_be_new: bool = False, enqueue: bool = False
    ) -> tuple[ConversationRow | None, str | None]:
        """:meth:`_free`'s checks and the run holding the conversation: with ``enqueue`` a held
        conversation is no refusal (the run will wait behind the holder)."""
        # The claim first, then the row: a run records its outcome before it frees the
        # claim (worker/run/ending.py), so a row read after a free claim is that run's
        # outcome. Read the other way round, a run turning `waiting` in between would
        # let a message through over its approval.
        holder = await live.active_run(self.redis, conversation_id)
        row = await self.store.conversation(conversation_id)
        if row is None and holder is None and not may_be_new:
            raise NotFound(f"conversation {conversation_id} not found")
        if holder is not None and not enqueue:
            raise _busy(conversation_id, holder)
        if waits_for_decision(row, holder):
            raise ApprovalPending(
                f"conversation {conversation_id} waits for a decision on its tool calls; "
                "send the decisions first"
            )
        return row, holder

    async def _existing(self, conversation_id: str) -> ConversationRow:
        row = await self._free(conversation_id)
        if row is None:  # its first run was accepted and is not recorded yet: it is queued
            raise NotFound(f"conversation {conversation_id} not found")
        return row

    async def _fork(self, request: ChatRequest, idempotency_key: str | None) -> ChatAccepted:
        """An edit (``replaces``) or a regenerate: a message run from where the thread received
        the user message named, leaving the branch after it as an alternative."""
        edit = request.replaces is not None
        if edit and request.regenerate is not None:
            raise BadRequest("replaces and regenerate do not go together: send one")
        message = self._message(request) if edit else None
        if not edit and request.message is not None:
            raise BadRequest("regenerate takes no message: it answers the same user message again")
        if request.resume:
            raise BadRequest("an edit or a regenerate is not a resume: leave resume out")
        if request.conversation is None:
            raise BadRequest(f"{'replaces' if edit else 'regenerate'} needs a conversation")
        conversation_id = parse_id(request.conversation, "conversation")
        target = request.replaces if request.replaces is not None else request.regenerate or ""
        idempotency = idempotency_of(idempotency_key, request, conversation_id)
        if idempotency is not None and (first := await first_answer(self.redis, idempotency)):
            return _answer(first, idempotency)
        structlog.contextvars.bind_contextvars(conversation_id=conversation_id)
        try:
            row = await self._existing(conversation_id)
            planned = functools.partial(branches.plan, target, edit)
            plan = await self.store.read_thread(conversation_id, planned)
            if plan is None or plan == branches.MISSING:
                raise NotFound(
                    f"message {target[:80]!r} is not on the current branch of conversation {conversation_id}"
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
            accepted = await self._enqueue(job, row.title, job.message, False, idempotency, owner=row.owner)
        except (SessionInProgress, ApprovalPending):
            # The first of several identical requests may have been accepted meanwhile.
            if idempotency is not None and (first := await first_answer(self.redis, idempotency)):
                return _answer(first, idempotency)
            raise
        abandoned = branches.acting(plan.abandoned, await self.store.tool_calls(conversation_id))
        log.info("run.forked", edit=edit, abandoned_calls=len(abandoned))
        if abandoned:
            accepted.abandoned_calls = abandoned
        return accepted

    async def switch(self, conversation_id: str, message_id: str) -> ChatAccepted:
        """Follow the branch that starts with ``message_id`` (at a fork point of the current
        branch) from now on: a run of kind ``switch``, in which the worker records it."""
        structlog.contextvars.bind_contextvars(conversation_id=conversation_id)
        row = await self._existing(conversation_id)
        target = functools.partial(branches.switch_target, message_id)
        head = await self.store.read_thread(conversation_id, target)
        if head is None:
            raise NotFound(
                f"no branch of conversation {conversation_id} starts with message {message_id[:80]!r} "
                "at a fork of its current branch"
            )
        return await self.follow(conversation_id, head, row)

    async def follow(
        self, conversation_id: str, checkpoint_id: str, row: ConversationRow | None = None
    ) -> ChatAccepted:
        """Make the branch whose head is ``checkpoint_id`` the one the conversation follows: a run
        of kind ``switch`` (a rollback's too, api/protocol/forks.py, which checked the checkpoint)."""
        if row is None:
            row = await self._existing(conversation_id)
        job = RunJob(
            run_id=new_id(), conversation_id=conversation_id, kind=JobKind.SWITCH, message=None,
            enqueued_at=time.time(), checkpoint_id=checkpoint_id,
        )
        return await self._enqueue(job, row.title, None, False, None, owner=row.owner)

    async def update_state(
        self, conversation_id: str, values: dict[str, Any], as_node: str | None
    ) -> ChatAccepted:
        """Write ``values`` into the thread's state as ``as_node`` would (the Agent Protocol's
        ``update_state``): a run of kind ``update``, through the same checks, claim and queue
        (a busy conversation is 409, as for a message). A thread created empty takes it too."""
        structlog.contextvars.bind_contextvars(conversation_id=conversation_id)
        row, _ = await self._open(conversation_id, may_be_new=True)
        job = RunJob(
            run_id=new_id(), conversation_id=conversation_id, kind=JobKind.UPDATE, message=None,
            enqueued_at=time.time(), new_conversation=row is None,
            checkpoint_id=row.branch_head if row is not None else None,
            update={"values": values, "as_node": as_node},
        )
        title = row.title if row is not None else title_of(None)
        return await self._enqueue(job, title, None, row is None, None, owner=row.owner if row else None)

    async def _decide(self, request: ChatRequest, idempotency_key: str | None) -> ChatAccepted:
        if request.conversation is None:
            raise BadRequest("decisions need a conversation")
        if request.message is not None or request.resume:
            raise BadRequest("decisions come alone: no message, no resume")
        conversation_id = parse_id(request.conversation, "conversation")
        decisions = request.decisions or []
        check_shape(decisions)
        idempotency = idempotency_of(idempotency_key, request, conversation_id)
        if idempotency is not None and (first := await first_answer(self.redis, idempotency)):
            return _answer(first, idempotency)
        try:
            structlog.contextvars.bind_contextvars(conversation_id=conversation_id)
            holder = await live.active_run(self.redis, conversation_id)  # then the row (see _submit)
            row = await self.store.conversation(conversation_id)
            if row is None and holder is None:
                raise NotFound(f"conversation {conversation_id} not found")
            if row is None or not waits_for_decision(row, holder):
                raise NoApprovalPending(f"conversation {conversation_id} has no approval pending")
            requests = await self.store.read_thread(conversation_id, pending_requests)
            if requests is None:
                raise NoApprovalPending(f"conversation {conversation_id} has no approval pending")
            job = RunJob(
                run_id=new_id(), conversation_id=conversation_id, kind=JobKind.DECIDE, message=None,
                enqueued_at=time.time(), decisions=match(decisions, requests),
            )
            return await self._enqueue(job, row.title, None, False, idempotency, owner=row.owner)
        except (SessionInProgress, NoApprovalPending):
            # The first of several identical requests may have been accepted meanwhile.
            if idempotency is not None and (first := await first_answer(self.redis, idempotency)):
                return _answer(first, idempotency)
            raise

    async def _enqueue(
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
            # A user's share (DESIGN.md "Fair shares"); an operator's runs are counted, not limited.
            limit = 0 if caller().operator else self.settings.user_max_active_runs
            submitted = await submit(
                self.redis, job, title=title, idempotency=idempotency, enqueue=enqueue, limit=limit,
            )
        if submitted.first is not None and idempotency is not None:
            return _answer(submitted.first, idempotency)
        if submitted.active is not None:
            log.warning("limit.active_runs", owner=job.owner, active=submitted.active, limit=limit)
            raise TooManyActiveRuns(
                f"{job.owner} has {submitted.active} runs queued or running, the most a user may have "
                f"(USER_MAX_ACTIVE_RUNS={limit}); retry when one ends",
                retry_after=ACTIVE_RUNS_RETRY_SECONDS,
            )
        # A holder equal to our own run id means a retried script had already run.
        if submitted.holder is not None and submitted.holder != job.run_id:
            raise _busy(conversation_id, submitted.holder)
        structlog.contextvars.bind_contextvars(run_id=job.run_id, job_id=job.run_id)  # arq job id = run id
        log.info("run.accepted", kind=job.kind.value, new_conversation=new,
                 **({"behind": submitted.behind} if submitted.behind is not None else {}),
                 **({"message": message} if self.settings.log_content else {}))
        return ChatAccepted(conversation=conversation_id, run=job.run_id)
