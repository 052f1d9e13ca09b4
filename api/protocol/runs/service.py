"""Runs through the Agent Protocol: Sophos's runs, created by the native chat service.

A run's input is one new user message (``{"messages": [{"role": "user", "content": ...}]}``);
a run with no input resumes the thread (``POST /api/chat {resume: true}``). Either goes through
``ChatService.submit_to_thread``: the same checks, the same atomic one-run-per-conversation
claim (a busy thread is 409, the ``reject`` strategy), the same queue and worker. What the
protocol adds to a run, its metadata, stream modes and webhook, is a Redis record beside it
(``protocol_run_key``, kept ``PROTOCOL_RUN_RETENTION_SECONDS``; shared/contracts/protocol.py reads it). A
webhook is checked here, before anything is submitted, and delivered by the worker once the run
ended (shared/contracts/webhooks.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import structlog
from redis.asyncio import Redis

from api.chat.relay import run_of_conversation
from api.chat.schemas import ChatAccepted, ChatRequest, DecisionBody
from api.chat.submit import ChatService
from api.http.ids import parse_id
from api.protocol.assistants.service import Assistants
from api.protocol.runs.commands import breakpoints_of, command_of
from api.protocol.runs.forks import Forks, checkpoint_of
from api.protocol.runs.input import (
    RunCreate,
    answers_of,
    message_of,
    refuse_unserved,
    resume_of,
    strategy_of,
    unanswered_calls,
)
from api.protocol.runs.interrupts import decisions_of
from api.protocol.status import RUN_STATUSES, run_status
from api.protocol.stream.translate import stream_modes
from api.protocol.threads.bodies import ThreadCreate
from api.protocol.threads.found import Found
from api.protocol.threads.service import Threads
from api.protocol.threads.state import pending_of
from api.runs.cancel import cancel_run
from api.runs.schemas import RunError, RunInfo
from api.runs.views import Runs, live
from shared.contracts.jobs import JobKind
from shared.contracts.protocol import ASSISTANT_ID as ASSISTANT_ID
from shared.contracts.protocol import RunRecord, sdk_run
from shared.contracts.webhooks import WebhookPolicy, WebhookRefused, enqueue_delivery
from shared.errors import (
    BadRequest,
    NoApprovalPending,
    NotFound,
    RunFinished,
    SessionInProgress,
    WaitingListFull,
)
from shared.redis.keys import PROTOCOL_RUN_RETENTION_SECONDS, protocol_run_key, waiting_key

log = structlog.get_logger(__name__)

RUNS_LIST_MAX = 1000
#: at most this many runs wait on one thread (``enqueue``): the next is 409 ``WAITING_LIST_FULL``
MAX_WAITING_RUNS = 16
#: how long ``interrupt`` waits for the cancelled run to end before answering 409 (a cancel ends a
#: running run within a second)
INTERRUPT_WAIT_SECONDS = 30.0
#: runs of Sophos's own, which the client did not ask for as runs: a rollback's switch
#: (api/protocol/runs/forks.py) and an update_state (api/protocol/threads/updates.py); not in runs.list
OWN_KINDS = (JobKind.SWITCH, JobKind.UPDATE)


@dataclass(frozen=True, slots=True)
class Options:
    """What the protocol adds to a run."""

    metadata: dict[str, Any]
    stream_mode: tuple[str, ...]
    multitask_strategy: str = "reject"
    #: its webhook's delivery, when it has one (shared/contracts/webhooks.py)
    webhook: dict[str, Any] | None = None
    #: the assistant it was made with
    assistant_id: str = ASSISTANT_ID

    @classmethod
    def parse(cls, fields: dict[str, str]) -> Options:
        record = RunRecord.parse(fields)
        return cls(
            record.metadata, record.stream_mode, record.multitask_strategy, record.webhook_state(),
            record.assistant_id,
        )


def run_shape(info: RunInfo, options: Options) -> dict[str, Any]:
    """The SDK's ``Run`` (with its webhook's delivery, when it has one)."""
    return sdk_run(
        run_id=info.id, thread_id=info.conversation, status=info.status, created_at=info.enqueued_at,
        started_at=info.started_at, finished_at=info.finished_at, metadata=options.metadata,
        multitask_strategy=options.multitask_strategy, stream_mode=options.stream_mode,
        webhook=options.webhook, error_code=_code(info), assistant_id=options.assistant_id,
    )


def _code(info: RunInfo) -> str | None:
    return info.error.code if isinstance(info.error, RunError) else None


@dataclass(frozen=True, slots=True)
class ProtocolRuns:
    chat: ChatService
    runs: Runs
    threads: Threads
    redis: Redis
    #: waits for the end of a run (thread id, run id): what ``interrupt`` needs after its cancel
    ended: Callable[[str, str], Awaitable[Any]]

    async def create(
        self, thread_id: str, body: RunCreate, *, streamed: bool = False
    ) -> tuple[dict[str, Any], Options]:
        """Accept a run on the thread (busy: 409, or with ``interrupt`` cancel the run holding it
        first); its ``Run`` and options. ``command.resume`` decides a waiting thread. ``streamed``:
        the run is streamed to its creator (``on_disconnect: cancel`` is served then)."""
        refuse_unserved(body, streamed=streamed)
        agent = await Assistants(self.runs.store, self.redis).agent_for_run(
            body.assistant_id, body.config, body.context
        )
        if body.webhook is not None:
            try:
                await WebhookPolicy.of(self.runs.settings).check(body.webhook)
            except WebhookRefused as exc:
                raise BadRequest(str(exc)) from None
        options = Options(
            body.metadata or {}, stream_modes(body.stream_mode), strategy_of(body),
            assistant_id=agent.assistant_id,
        )
        fork = checkpoint_of(body.checkpoint_id, body.checkpoint)
        # A command without resume (goto, update) is the run's input (api/protocol/runs/commands.py).
        command = None
        if body.command is not None and "resume" not in body.command:
            command = command_of(body.command, body.input)
            if fork is not None:
                raise BadRequest("checkpoint_id is not taken with command: a command continues the thread")
        breakpoints = breakpoints_of(body.interrupt_before, body.interrupt_after)
        delayed = bool(body.after_seconds)
        if body.command is not None and command is None:
            if delayed:
                raise BadRequest("after_seconds is not taken with command.resume: decisions are acted on now")
            if breakpoints is not None:
                raise BadRequest("interrupt_before and interrupt_after are not taken with command.resume")
            resume = resume_of(body)
            found = await self.threads.find(thread_id)
            if fork is not None:
                await self._at_head(found, fork)
            # A busy thread waits for no decision (409 NO_APPROVAL_PENDING): nothing to take over.
            accepted = await self._decide(thread_id, resume)
            return await self._created(thread_id, accepted, options, kind="decide", webhook=body.webhook)
        answers, graph_input = answers_of(body.input)
        message = message_of(graph_input)
        if answers:
            if message is None:
                raise BadRequest("tool messages in the input must be followed by a new user message")
            found = await self.threads.find(thread_id)
            if fork is not None:
                await self._at_head(found, fork)
            if await self._answer(found, answers, options):
                fork, options = None, Options(options.metadata, options.stream_mode, "enqueue")
        if options.multitask_strategy == "rollback" and message is None:
            raise BadRequest("multitask_strategy rollback takes a run with input (a new message)")
        if fork is not None and options.multitask_strategy == "enqueue":
            raise BadRequest(
                "checkpoint_id is not taken with multitask_strategy enqueue: a run that waits starts "
                "from the thread as its turn finds it (use reject or interrupt to fork)"
            )
        if fork is not None:
            await self.threads.find(thread_id)
            await self.forks.check(thread_id, fork, message)
        if options.multitask_strategy == "enqueue" and not delayed:
            await self._room_to_wait(thread_id)
        record = await self.threads.records.get(thread_id)
        if record is None:
            try:
                await self.threads.find(thread_id)
            except NotFound:
                if body.if_not_exists != "create":
                    raise
                await self.threads.create(ThreadCreate(thread_id=thread_id, if_exists="do_nothing"))
                record = await self.threads.records.get(thread_id)
        accepted = await self._taking_over(
            thread_id, options,
            lambda rolled_back_to: self.chat.submit_to_thread(
                thread_id, message, may_be_new=record is not None, checkpoint_id=fork or rolled_back_to,
                # A delayed run waits for its time, not behind another run: on a busy thread it is 409.
                enqueue=options.multitask_strategy == "enqueue" and not delayed, agent=agent,
                command=command, breakpoints=breakpoints, after_seconds=float(body.after_seconds or 0),
            ),
        )
        if record is not None:
            await self.threads.records.ran(thread_id, record.owner)
            if (record.assistant_id or ASSISTANT_ID) != agent.assistant_id:
                await self.threads.records.ran_with(thread_id, agent.assistant_id)
        return await self._created(
            thread_id, accepted, options, kind="resume" if message is None else "run", webhook=body.webhook
        )

    async def _room_to_wait(self, thread_id: str) -> None:
        """Refuse a run that would wait behind :data:`MAX_WAITING_RUNS` others on the thread.

        Checked before the submission, not in its script: runs created at the same instant may
        each pass it, so the list may hold a few more, never an unbounded number."""
        waiting: int = await self.redis.llen(waiting_key(thread_id))  # type: ignore[misc]
        if waiting >= MAX_WAITING_RUNS:
            raise WaitingListFull(
                f"thread {thread_id} already has {waiting} runs waiting (at most {MAX_WAITING_RUNS}): "
                "wait for one to end, or cancel one"
            )

    async def _at_head(self, found: Found, checkpoint_id: str) -> None:
        """A command's checkpoint must be the thread's head, where it waits for the decisions
        (agent-chat-ui's ``useStream`` sends the head it read with every run); any other would
        fork, and decisions continue the thread where it waits."""
        head = (await self.threads.state_of(found)).get("checkpoint") or {}
        if checkpoint_id != head.get("checkpoint_id"):
            raise BadRequest(
                f"checkpoint_id {checkpoint_id} is not the head of thread {found.id}: a command "
                "continues the thread where it waits (send its head, or no checkpoint)"
            )

    async def _answer(self, found: Found, answers: dict[str, str], options: Options) -> bool:
        """Tool messages for the calls a thread waits on, sent with a new message: each call is
        rejected (never sent), the tool message's text told to the model as the reason, before
        the message runs (True: a decision run was submitted). The Agent Server takes them as the
        calls' results; Sophos's approvals give a call a result only by running it, so they are
        its rejections. On a thread whose run was cut while its calls were out (no decision
        pending), they are left out: the message runs as it would alone (False), from the last
        step kept, and those calls are not sent again."""
        thread_id = found.id
        pending = await self.threads.store.read_thread(thread_id, pending_of)
        requests = [r for _, rs in pending or [] for r in rs]
        if not requests:
            messages = (await self.threads.state_of(found))["values"].get("messages") or []
            if answers and sorted(answers) == sorted(unanswered_calls(messages)):
                return False
            raise NoApprovalPending(
                f"thread {thread_id} waits for no decision: tool messages in the input answer "
                "pending calls, or calls a cut run left without a result, only"
            )
        waiting = [str(r["id"]) for r in requests]
        if sorted(answers) != sorted(waiting):
            raise BadRequest(
                f"the input's tool messages answer {', '.join(sorted(answers))}, but the thread waits on "
                f"{', '.join(waiting)}: answer every pending call, or none"
            )
        decisions = [DecisionBody(id=i, action="reject", message=answers[i] or None) for i in waiting]
        decided = await self.chat.submit(ChatRequest(conversation=thread_id, decisions=decisions))
        await self._created(thread_id, decided, options, kind="decide")
        return True

    async def _decide(self, thread_id: str, resume: Any) -> ChatAccepted:
        """The decisions of ``command.resume``, mapped onto the pending requests, through the
        native decision path (the same checks; acted on once)."""
        pending = await self.threads.store.read_thread(thread_id, pending_of)
        if not pending:
            raise NoApprovalPending(f"thread {thread_id} waits for no decision: there is nothing to resume")
        decisions = decisions_of(resume, pending)
        return await self.chat.submit(ChatRequest(conversation=thread_id, decisions=decisions))

    async def _taking_over(
        self, thread_id: str, options: Options, submit: Callable[[str | None], Awaitable[ChatAccepted]]
    ) -> ChatAccepted:
        """``submit(None)``; when the thread is busy and the strategy is ``interrupt``, cancel the
        run holding it, wait for its end and submit once more (busy again: 409). ``rollback``
        submits from where the cancelled run started (api/protocol/runs/forks.py)."""
        try:
            return await submit(None)
        except SessionInProgress:
            if options.multitask_strategy not in ("interrupt", "rollback"):
                raise
        holder = await live.active_run(self.redis, thread_id)
        if holder is not None:
            log.info("protocol.interrupting", conversation_id=thread_id, run_id=holder)
            with contextlib.suppress(RunFinished, NotFound):  # it ended by itself meanwhile
                await cancel_run(self.runs, holder)
            try:
                async with asyncio.timeout(INTERRUPT_WAIT_SECONDS):
                    await self.ended(thread_id, holder)
            except TimeoutError as exc:
                raise SessionInProgress(
                    f"thread {thread_id}: run {holder} was cancelled but has not ended yet"
                ) from exc
            if options.multitask_strategy == "rollback":
                return await submit(await self.forks.new_run_start(thread_id, holder))
        return await submit(None)

    async def _created(
        self, thread_id: str, accepted: ChatAccepted, options: Options, *, kind: str,
        webhook: str | None = None,
    ) -> tuple[dict[str, Any], Options]:
        key = protocol_run_key(accepted.run)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping={
                "metadata": msgspec.json.encode(options.metadata).decode(),
                "stream_mode": msgspec.json.encode(list(options.stream_mode)).decode(),
                "multitask_strategy": options.multitask_strategy,
                "assistant_id": options.assistant_id,
                # Whatever ends the run enqueues its delivery (shared/contracts/webhooks.py).
                **({"webhook": webhook} if webhook is not None else {}),
            })
            pipe.expire(key, PROTOCOL_RUN_RETENTION_SECONDS)
            await pipe.execute()
        if webhook is not None and (await self._info(accepted.run)).status.finished:
            # It ended before the record named its webhook: its ending enqueued nothing (the
            # ending is recorded before its script runs, so one of the two enqueues it; once).
            await enqueue_delivery(self.redis, accepted.run, thread_id)
        log.info("protocol.run_created", conversation_id=thread_id, run_id=accepted.run, kind=kind)
        return await self.get(thread_id, accepted.run), options

    async def options(self, run_id: str) -> Options:
        fields: dict[str, str] = await self.redis.hgetall(protocol_run_key(run_id))  # type: ignore[misc]
        return Options.parse(fields)

    async def check(self, thread_id: str, run_id: str) -> str:
        """``run_id`` (parsed), if it is a run of the thread; NotFound otherwise."""
        run_id = parse_id(run_id, "run_id")
        return await run_of_conversation(self.runs.store, self.redis, thread_id, run_id)

    async def get(self, thread_id: str, run_id: str) -> dict[str, Any]:
        run_id = await self.check(thread_id, run_id)
        return run_shape(await self._info(run_id), await self.options(run_id))

    async def _info(self, run_id: str) -> RunInfo:
        # Queued, taken and not yet recorded, running, or ended with or without a row (Runs.get).
        return await self.runs.get(run_id)

    async def list(
        self, thread_id: str, *, limit: int, offset: int, status: str | None
    ) -> list[dict[str, Any]]:
        await self.threads.find(thread_id)
        if not 1 <= limit <= RUNS_LIST_MAX or offset < 0:
            raise BadRequest(f"limit must be 1 to {RUNS_LIST_MAX} and offset at least 0")
        if status is not None and status not in RUN_STATUSES:
            raise BadRequest(f"status must be one of {', '.join(sorted(RUN_STATUSES))}")
        want = RUNS_LIST_MAX if status is not None else offset + limit
        page = await self.runs.page(status=None, conversation_id=thread_id, limit=want, cursor=None)
        # A rollback's switch run (api/protocol/runs/forks.py) is Sophos's, not one the client asked for:
        # left out, so a full page that held one is read further.
        if len(page.runs) == want < RUNS_LIST_MAX and any(r.kind in OWN_KINDS for r in page.runs):
            page = await self.runs.page(
                status=None, conversation_id=thread_id, limit=RUNS_LIST_MAX, cursor=None
            )
        infos = [
            r for r in page.runs
            if r.kind not in OWN_KINDS and (status is None or run_status(r.status, _code(r)) == status)
        ]
        shown = infos[offset : offset + limit]
        return [run_shape(info, await self.options(info.id)) for info in shown]

    @property
    def forks(self) -> Forks:
        return Forks(self.chat, self.runs, self.threads.store, self.ended)

    async def delete_thread(self, thread_id: str) -> None:
        """Delete the thread, as the Agent Server does a busy one: the runs waiting on it and the
        run holding it are cancelled first, their ends awaited, then it is deleted (409 only if
        a run still holds it after :data:`INTERRUPT_WAIT_SECONDS`)."""
        deadline = asyncio.get_running_loop().time() + INTERRUPT_WAIT_SECONDS
        while True:
            try:
                await self.threads.delete(thread_id)
                return
            except SessionInProgress:
                if asyncio.get_running_loop().time() > deadline:
                    raise
            await self._stop(thread_id, deadline)

    async def _stop(self, thread_id: str, deadline: float) -> None:
        """Cancel the runs waiting on the thread (last first: none of them takes its turn), then
        the run holding it, and wait for its end."""
        waiting: list[str] = await self.redis.lrange(waiting_key(thread_id), 0, -1)  # type: ignore[misc]
        for run_id in reversed(waiting):
            with contextlib.suppress(RunFinished, NotFound):
                await cancel_run(self.runs, run_id)
        holder = await live.active_run(self.redis, thread_id)
        if holder is None:
            await asyncio.sleep(0.05)  # between two runs' turns, or a deletion of its own
            return
        log.info("protocol.cancelling_to_delete", conversation_id=thread_id, run_id=holder)
        with contextlib.suppress(RunFinished, NotFound):
            await cancel_run(self.runs, holder)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, deadline - asyncio.get_running_loop().time())):
                await self.ended(thread_id, holder)

    async def cancel(self, thread_id: str, run_id: str, action: str) -> None:
        """Cancel the run; ``rollback`` then takes the thread back to where it started. Any other
        action means ``interrupt``, as the Agent Server reads it."""
        run_id = await self.check(thread_id, run_id)
        if action == "rollback":
            await self.forks.rollback(thread_id, run_id)
        else:
            await cancel_run(self.runs, run_id)
