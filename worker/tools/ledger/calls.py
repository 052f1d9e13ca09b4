"""A tool call's way through the ledger (worker/tools/ledger/__init__.py): :class:`Ledger`, whose
:meth:`Ledger.run` answers a call from its record, asks its MCP task's server, sends it again, puts
it to a person, or sends it, between intent and outcome.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from langchain_core.messages import ToolMessage
from langgraph.types import interrupt

from shared import tracing
from shared.contracts.jobs import DecisionAction
from shared.contracts.ledger import DONE, TASK_FORGOTTEN
from shared.redis.metrics import TOOL_CALLS, TOOL_CALLS_FROM_TASK, TOOL_CALLS_REPEATED
from shared.storage import Database
from worker.metrics import counted
from worker.tools.ledger.attempt import OnTask, sending
from worker.tools.ledger.records import CallRef, Entry, Records, message
from worker.tools.ledger.uncertain import (
    UNCERTAIN_MARK,
    decision_for,
    unanswered_again_text,
    uncertain_rejection_text,
    uncertain_request,
)

log = structlog.get_logger(__name__)

#: how often a call of a tool that is safe to repeat is sent again, with its key, when its answer
#: did not come (timed out, transport lost) before its error is its outcome
UNANSWERED_RESENDS = 1

#: asks the server of a call made as an MCP task for the task's result: the call's tool message, or
#: None when the server does not know the task (worker/tools/tasks.py, worker/agent/graph.py)
AskTask = Callable[[str], Awaitable[ToolMessage | None]]


class Ledger(Records):
    """The ledger: its records (worker/tools/ledger/records.py) and each call's way through them.

    Test-only fault points (worker/faults.py): ``after_outcome`` is called after each outcome
    commit (:class:`~worker.tools.ledger.records.Records`); ``hold(point, tool)`` is awaited before
    the intent, after it (before the request), before each commit of the call's MCP task state (the
    first carries the task's id: the server made the task) and after the result (before the
    outcome's commit).
    """

    def __init__(
        self,
        db: Database,
        *,
        after_outcome: Callable[[], None] | None = None,
        hold: Callable[[str, str], Awaitable[None]] | None = None,
    ) -> None:
        super().__init__(db, after_outcome=after_outcome)
        self.hold = hold

    async def _at(self, point: str, tool: str) -> None:
        if self.hold is not None:
            await self.hold(point, tool)

    async def run(
        self,
        ref: CallRef,
        run_id: str,
        call: dict[str, Any],
        send: Callable[[dict[str, Any]], Awaitable[ToolMessage]],
        *,
        safe_to_repeat: bool = False,
        ask: AskTask | None = None,
    ) -> ToolMessage:
        """The call's result: from the ledger if it is done, else by ``send(arguments)`` between
        intent and outcome; an uncertain call is sent again only if ``safe_to_repeat`` or a
        person decides so (worker/tools/ledger/__init__.py).

        ``send`` makes the request (its ``_meta`` carries the key,
        :func:`~worker.tools.ledger.attempt.request_meta`) and returns the ToolMessage the model
        gets, an error included. A cancellation or a crash inside it leaves the intent without
        outcome. ``ask(task_id)`` asks the server of a call made as an MCP task for that task's
        result. With tracing, the call is a span (GenAI's ``execute_tool``) saying what the ledger
        made of it (``sophos.tool.ledger``).
        """
        with tracing.span(f"execute_tool {call['name']}", {
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": call["name"],
            "gen_ai.tool.call.id": ref.tool_call_id, "sophos.tool.safe_to_repeat": safe_to_repeat,
        }):
            return await self._run(ref, run_id, call, send, safe_to_repeat=safe_to_repeat, ask=ask)

    async def _run(
        self,
        ref: CallRef,
        run_id: str,
        call: dict[str, Any],
        send: Callable[[dict[str, Any]], Awaitable[ToolMessage]],
        *,
        safe_to_repeat: bool,
        ask: AskTask | None,
    ) -> ToolMessage:
        name, arguments = call["name"], call.get("args") or {}

        async def on_task(task_id: str, state: str) -> None:
            # The first report is the server's answer to the request: the task exists, its id is
            # not committed yet (a crash here leaves an intent without a task id: uncertain).
            await self._at("before_task_state", name)
            await self.record_task(ref, task_id, state)

        await self._at("before_intent", name)
        entry = await self.begin(ref, run_id, name, arguments, safe_to_repeat=safe_to_repeat)
        decided: dict[str, Any] | None = None
        if entry is None:
            known = await self.entry(ref)
            if known is None:  # deleted meanwhile (its conversation was): nothing to answer from
                raise RuntimeError(f"tool call {ref.tool_call_id} vanished from the ledger")
            if known.state == DONE:
                _traced("answered", known)
                return self._answer(ref, name, known)
            if known.task_id is not None and known.task_state != TASK_FORGOTTEN and ask is not None:
                answered = await self._from_task(ref, name, known, known.task_id, ask, on_task)
                if answered is not None:
                    return answered
            if safe_to_repeat:
                _sent_again(ref, name, known.attempt + 1, "safe_to_repeat", "safe_to_repeat")
                entry = await self.again(ref, run_id)
            else:
                # Nothing above acted: on resume this task runs again from its start to here.
                answer = interrupt(uncertain_request(ref, name, arguments, known.attempt))
                decision = decision_for(ref.tool_call_id, answer)
                decided = {"action": decision.action.value, "attempts": known.attempt,
                           **({"message": decision.message} if decision.message else {})}
                if decision.action is DecisionAction.REJECT:
                    _traced("not_repeated", known)
                    result = ToolMessage(
                        uncertain_rejection_text(decision), tool_call_id=ref.tool_call_id, name=name,
                        status="error", id=str(uuid.uuid4()), response_metadata={UNCERTAIN_MARK: decided},
                    )
                    await self.record_outcome(ref, "error", result.content)
                    counted(TOOL_CALLS, {"outcome": "not_repeated"})
                    return result
                if decision.action is DecisionAction.EDIT:
                    decided["proposed"] = arguments
                    arguments = decision.arguments or {}
                    entry = await self.again(ref, run_id, arguments)
                else:
                    entry = await self.again(ref, run_id)
                _sent_again(ref, name, known.attempt + 1, f"decided_{decision.action.value}", "decided")
            if entry is None:  # done meanwhile
                return await self._done_meanwhile(ref, name)
        resent = 0
        while True:
            await self._at("after_intent", name)
            _traced("sent" if entry.attempt == 1 else f"sent_again_{'decided' if decided else 'safe'}", entry)
            with sending(entry.key, on_task) as attempt:
                result = await send(arguments)
            if attempt.unanswered is None:
                break
            # Sent, and no answer: it may have acted, exactly like a call cut by a crash.
            log.warning("tool_call.unanswered", tool=name, tool_call_id=ref.tool_call_id,
                        attempt=entry.attempt, why=attempt.unanswered)
            if safe_to_repeat and resent < UNANSWERED_RESENDS:
                resent += 1
                _sent_again(ref, name, entry.attempt + 1, "unanswered", "safe_to_repeat")
                again = await self.again(ref, run_id)
                if again is None:  # done meanwhile
                    return await self._done_meanwhile(ref, name)
                entry = again
                continue
            if not safe_to_repeat:
                if decided is None:
                    # The question a crash would have led to, asked now; on the decision this task
                    # runs again from its start and finds the same intent (the path above).
                    _traced("unanswered", entry)
                    interrupt(uncertain_request(ref, name, arguments, entry.attempt))
                # Sent again on a decision and unanswered again: the model is told that it may
                # have acted, never to call it again as if it had failed (docs/approvals.md).
                result = ToolMessage(
                    unanswered_again_text(attempt.unanswered), tool_call_id=ref.tool_call_id, name=name,
                    status="error", id=str(uuid.uuid4()),
                )
            break  # safe to repeat and still unanswered: its error is the outcome; repeating is harmless
        if decided is not None:
            result.response_metadata = {**result.response_metadata, UNCERTAIN_MARK: decided}
        await self._outcome(ref, name, result)
        return result

    async def _from_task(
        self, ref: CallRef, name: str, known: Entry, task_id: str, ask: AskTask, on_task: OnTask,
    ) -> ToolMessage | None:
        """The outcome of a call made as an MCP task, from its server; None when the server does not
        know the task (recorded: it is not asked again) or cannot be asked: the call is uncertain."""
        try:
            with sending(known.key, on_task):
                result = await ask(task_id)
        except Exception as exc:  # the server cannot be asked now: as uncertain as without a task
            log.warning("tool_call.task_not_asked", tool=name, tool_call_id=ref.tool_call_id, task_id=task_id,
                        error=f"{type(exc).__name__}: {exc}")
            return None
        if result is None:
            log.warning("tool_call.task_forgotten", tool=name, tool_call_id=ref.tool_call_id, task_id=task_id)
            await self.record_task(ref, task_id, TASK_FORGOTTEN)
            return None
        _traced("answered_from_task", known)
        log.info("tool_call.answered_from_task", tool=name, tool_call_id=ref.tool_call_id, task_id=task_id,
                 status=result.status)
        await self._outcome(ref, name, result)
        counted(TOOL_CALLS_FROM_TASK)
        return result

    async def _outcome(self, ref: CallRef, name: str, result: ToolMessage) -> None:
        """Commit the outcome of a call that was sent (or asked of its task), and count it."""
        await self._at("before_outcome", name)
        await self.record_outcome(ref, result.status, result.content)
        counted(TOOL_CALLS, {"outcome": "error" if result.status == "error" else "success"})

    async def _done_meanwhile(self, ref: CallRef, name: str) -> ToolMessage:
        """The answer of a call whose next attempt found it done (another worker recorded it)."""
        done = await self.entry(ref)
        if done is not None and done.state == DONE:
            _traced("answered", done)
            return self._answer(ref, name, done)
        raise RuntimeError(f"tool call {ref.tool_call_id} changed under its attempt")

    @staticmethod
    def _answer(ref: CallRef, name: str, entry: Entry) -> ToolMessage:
        counted(TOOL_CALLS, {"outcome": "answered"})
        log.info("tool_call.answered_from_ledger", tool=name, tool_call_id=ref.tool_call_id,
                 attempts=entry.attempt)
        return message(ref, name, entry)


def _sent_again(ref: CallRef, name: str, attempt: int, reason: str, counted_as: str) -> None:
    """Log and count a call about to be sent again: ``reason`` in the log, ``counted_as`` the
    :data:`~shared.redis.metrics.TOOL_CALLS_REPEATED` label (``safe_to_repeat`` or ``decided``)."""
    log.warning("tool_call.sent_again", tool=name, tool_call_id=ref.tool_call_id, attempt=attempt,
                reason=reason)
    counted(TOOL_CALLS_REPEATED, {"reason": counted_as})


def _traced(state: str, entry: Entry) -> None:
    """What the ledger made of the call, on its span: sent (first attempt), sent again (its tool
    is safe to repeat, or a person decided), answered from the ledger, or not repeated."""
    # Not the key: a trace goes to whoever runs the collector, and the key is what a tool server
    # deduplicates by (the detail and the exports show it to the conversation's owner).
    tracing.annotate({"sophos.tool.ledger": state, "sophos.tool.attempt": entry.attempt})
