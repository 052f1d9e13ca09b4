"""The ledger of tool effects: where a tool call is recorded before and after it acts.

A tool call is the one part of a run that acts on the world, and LangGraph's own record of
it is not enough: it saves a finished task's writes in the background (``put_writes`` is not
awaited even with ``durability="sync"``, langgraph#8039 / #8234, checked on langgraph
1.2.24), so a worker killed just after a call returned can lose the record and run the call
again on resume. The ledger (table ``tool_calls``, shared/storage/schema.py migration 5) decides
instead. For each call of an assistant message, in :meth:`Ledger.run`:

1. **Intent**, committed and awaited before the request leaves: conversation, run, message,
   tool call id, tool, arguments, idempotency key, attempt number. On PostgreSQL the same
   transaction checks the run's lease (:func:`shared.storage.postgres.hold_lease`): a worker
   that lost its run sends nothing.
2. The request, with the key in its ``_meta`` as ``"sophos/idempotency-key"``
   (:data:`IDEMPOTENCY_META_KEY`; worker/tools/mcp.py reads :func:`request_meta`).
3. **Outcome** (the result or the error the model is given), committed before the call's
   task returns. Not fenced: it records a fact, whoever holds the run now.

A call whose outcome is recorded is answered from the ledger on every later attempt, and
never sent again, whatever LangGraph's writes say.

The key is made once per call (a random UUID, on its first intent) and kept on every attempt;
every other call gets another. A tool server can deduplicate with it (docs: tool authors).

A call with an intent and no outcome (the worker died while it was sent, or between its
result and the outcome's commit) is *uncertain*: it may have acted. On the next attempt it
is sent again, with the same key, only when its tool is safe to repeat (the MCP tool's
``readOnlyHint`` or ``idempotentHint``, or ``safeToRepeat`` in ``mcp.json``:
worker/tools/mcp.py). Any other uncertain call is put to a person: its task raises an
interrupt whose request has ``"kind": "uncertain"`` (one per call, each task its own, so the
run ends ``waiting`` with every such call listed and the finished siblings kept), and the
decision decides: approve sends it again with the same key, edit sends new arguments under a
new key, reject never sends it (the model is told it may or may not have taken effect). Nothing
before ``interrupt()`` acts: on resume the task runs again from its start and reads the same row.

A call whose answer did not come (it timed out, or its transport was lost after it was sent: the
tool's transport says so through :func:`unanswered`) is the same case, met without a crash: it is
never an error the model would retry under a new tool call id, so a new key. A tool safe to repeat
is sent again at once with the same key (:data:`UNANSWERED_RESENDS` times; then its error is the
outcome, repeating it being harmless); any other call is put to a person as above, in the run that
sent it. One sent again on that decision that gets no answer again is not asked about twice (a task
asks once: on resume it replays its answers from the start): the model is told it may have acted.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import structlog
from langchain_core.messages import ToolMessage
from langgraph.types import interrupt

from shared import tracing
from shared.contracts.codec import decode
from shared.contracts.jobs import Decision, DecisionAction
from shared.redis.metrics import TOOL_CALLS, TOOL_CALLS_REPEATED
from shared.storage import Database
from shared.storage.leases import hold_lease
from shared.storage.schema import now_iso
from worker.metrics import counted

log = structlog.get_logger(__name__)

#: the key of a ``tools/call`` request's ``_meta`` that carries the call's idempotency key
IDEMPOTENCY_META_KEY = "sophos/idempotency-key"

#: the states of a ledger row
INTENT = "intent"
DONE = "done"

#: the ``kind`` of an approval request: a configured approval, or a call that may have run
APPROVAL_KIND = "approval"
UNCERTAIN_KIND = "uncertain"
#: ``response_metadata`` key of the result of an uncertain call: what was decided, and why
UNCERTAIN_MARK = "sophos_uncertain"


def uncertain_rejection_text(decision: Decision) -> str:
    """What the model is told of an uncertain call the user chose not to send again."""
    text = (
        "This tool call may or may not have taken effect: it was sent and its answer never came (the "
        "worker stopped, or the tool did not answer in time). The user chose not to repeat it, so it "
        "was not sent again."
    )
    return f"{text} Their message: {decision.message}" if decision.message else text


def unanswered_again_text(why: str) -> str:
    """What the model is told of a call sent again on the user's decision that got no answer again."""
    return (
        f"This tool call may or may not have taken effect: it was sent again on the user's decision and"
        f" again got no answer ({why}). It was not sent a third time; do not call it again unless the"
        " user asks."
    )

#: how often a call of a tool that is safe to repeat is sent again, with its key, when its answer
#: did not come (timed out, transport lost) before its error is its outcome
UNANSWERED_RESENDS = 1

@dataclass(slots=True)
class Attempt:
    """The request being made in this context (set by :meth:`Ledger.run`): its ``_meta``, and
    why its answer did not come, once the tool's transport says so (:func:`unanswered`)."""

    meta: dict[str, Any]
    unanswered: str | None = None


_ATTEMPT: ContextVar[Attempt | None] = ContextVar("sophos_tool_attempt", default=None)


def request_meta() -> dict[str, Any] | None:
    """The ``_meta`` for a ``tools/call`` request made now: the call's idempotency key, if any."""
    attempt = _ATTEMPT.get()
    return attempt.meta if attempt is not None else None


def unanswered(why: str) -> None:
    """Say that the request made now was sent and its answer did not come: it timed out, or the
    transport was lost (worker/tools/mcp.py). The call may have acted: the ledger treats it as a
    call cut by a crash (module docstring), whatever error the model would otherwise be given."""
    attempt = _ATTEMPT.get()
    if attempt is not None:
        attempt.unanswered = why


@contextmanager
def sending(key: str) -> Iterator[Attempt]:
    """The context a request of the call keyed ``key`` is made in (see :func:`request_meta`)."""
    attempt = Attempt({IDEMPOTENCY_META_KEY: key})
    token = _ATTEMPT.set(attempt)
    try:
        yield attempt
    finally:
        _ATTEMPT.reset(token)


@dataclass(frozen=True, slots=True)
class CallRef:
    """One tool call: the assistant message that made it, in its conversation."""

    conversation_id: str
    message_id: str
    tool_call_id: str


@dataclass(frozen=True, slots=True)
class Entry:
    """A call's row: its key, how many intents were committed, and its outcome once known."""

    key: str
    attempt: int
    state: str
    #: ``"success"`` or ``"error"`` (a ToolMessage's status), once done
    status: str | None = None
    #: the ToolMessage's content, once done
    content: Any = None


_ENTRY_COLUMNS = "idempotency_key, attempt, state, status, result"
_WHERE = "conversation_id = ? AND message_id = ? AND tool_call_id = ?"


def _entry(row: tuple[Any, ...]) -> Entry:
    content = json.loads(row[4]) if row[4] is not None else None
    return Entry(key=str(row[0]), attempt=int(row[1]), state=str(row[2]), status=row[3], content=content)


class Ledger:
    """The ``tool_calls`` table, on the worker's application database (either engine).

    Test-only fault points (worker/faults.py): ``after_outcome`` is called after each outcome
    commit; ``hold(point, tool)`` is awaited before the intent, after it (before the request)
    and after the result (before the outcome's commit).
    """

    def __init__(
        self,
        db: Database,
        *,
        after_outcome: Callable[[], None] | None = None,
        hold: Callable[[str, str], Awaitable[None]] | None = None,
    ) -> None:
        self.db = db
        self.after_outcome = after_outcome
        self.hold = hold

    async def _at(self, point: str, tool: str) -> None:
        if self.hold is not None:
            await self.hold(point, tool)

    async def entry(self, ref: CallRef) -> Entry | None:
        rows = await self.db.fetchall(
            f"SELECT {_ENTRY_COLUMNS} FROM tool_calls WHERE {_WHERE}",
            (ref.conversation_id, ref.message_id, ref.tool_call_id),
        )
        return _entry(rows[0]) if rows else None

    async def begin(
        self, ref: CallRef, run_id: str, tool: str, arguments: dict[str, Any], *, safe_to_repeat: bool = False
    ) -> Entry | None:
        """Commit the intent of the call's first attempt, with a new key; None (nothing written)
        when the call has a row already: done, or uncertain. Raises ``LeaseLost`` on PostgreSQL
        when the run is no longer this worker's."""
        async with self.db.transaction() as tx:
            await hold_lease(tx)
            rows = await tx.fetchall(
                "INSERT INTO tool_calls (conversation_id, message_id, tool_call_id, run_id, tool, arguments,"
                " idempotency_key, attempt, state, intent_at, safe_to_repeat)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, 1, ?, ?, ?)"
                " ON CONFLICT (conversation_id, message_id, tool_call_id) DO NOTHING"
                f" RETURNING {_ENTRY_COLUMNS}",
                (ref.conversation_id, ref.message_id, ref.tool_call_id, run_id, tool,
                 json.dumps(arguments, ensure_ascii=False), str(uuid.uuid4()), INTENT, now_iso(),
                 int(safe_to_repeat)),
            )
        return _entry(rows[0]) if rows else None

    async def again(
        self, ref: CallRef, run_id: str, arguments: dict[str, Any] | None = None
    ) -> Entry | None:
        """Commit the intent of another attempt of an uncertain call: the same key, or with
        ``arguments`` (an edit) a new key and those arguments. None when the call is done
        meanwhile (nothing written). Fenced like :meth:`begin`."""
        edit = ""
        params: list[Any] = [run_id, now_iso()]
        if arguments is not None:
            edit = ", arguments = ?, idempotency_key = ?"
            params += [json.dumps(arguments, ensure_ascii=False), str(uuid.uuid4())]
        async with self.db.transaction() as tx:
            await hold_lease(tx)
            rows = await tx.fetchall(
                f"UPDATE tool_calls SET attempt = attempt + 1, run_id = ?, intent_at = ?{edit}"
                f" WHERE {_WHERE} AND state = ? RETURNING {_ENTRY_COLUMNS}",
                (*params, ref.conversation_id, ref.message_id, ref.tool_call_id, INTENT),
            )
        return _entry(rows[0]) if rows else None

    async def record_outcome(self, ref: CallRef, status: str, content: Any) -> None:
        """Commit the call's outcome (the first one recorded stays)."""
        async with self.db.transaction() as tx:
            await tx.execute(
                f"UPDATE tool_calls SET state = ?, status = ?, result = ?, outcome_at = ? WHERE {_WHERE}"
                " AND state = ?",
                (DONE, status, json.dumps(content, ensure_ascii=False), now_iso(),
                 ref.conversation_id, ref.message_id, ref.tool_call_id, INTENT),
            )
        if self.after_outcome is not None:
            self.after_outcome()

    async def run(
        self,
        ref: CallRef,
        run_id: str,
        call: dict[str, Any],
        send: Callable[[dict[str, Any]], Awaitable[ToolMessage]],
        *,
        safe_to_repeat: bool = False,
    ) -> ToolMessage:
        """The call's result: from the ledger if it is done, else by ``send(arguments)`` between
        intent and outcome; an uncertain call is sent again only if ``safe_to_repeat`` or a
        person decides so (module docstring).

        ``send`` makes the request (its ``_meta`` carries the key, :func:`request_meta`) and
        returns the ToolMessage the model gets, an error included. A cancellation or a crash
        inside it leaves the intent without outcome. With tracing, the call is a span
        (GenAI's ``execute_tool``) saying what the ledger made of it (``sophos.tool.ledger``).
        """
        with tracing.span(f"execute_tool {call['name']}", {
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": call["name"],
            "gen_ai.tool.call.id": ref.tool_call_id, "sophos.tool.safe_to_repeat": safe_to_repeat,
        }):
            return await self._run(ref, run_id, call, send, safe_to_repeat=safe_to_repeat)

    async def _run(
        self,
        ref: CallRef,
        run_id: str,
        call: dict[str, Any],
        send: Callable[[dict[str, Any]], Awaitable[ToolMessage]],
        *,
        safe_to_repeat: bool,
    ) -> ToolMessage:
        name, arguments = call["name"], call.get("args") or {}
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
            if safe_to_repeat:
                log.warning("tool_call.sent_again", tool=name, tool_call_id=ref.tool_call_id,
                            attempt=known.attempt + 1, reason="safe_to_repeat")
                counted(TOOL_CALLS_REPEATED, {"reason": "safe_to_repeat"})
                entry = await self.again(ref, run_id)
            else:
                # Nothing above acted: on resume this task runs again from its start to here.
                answer = interrupt(_uncertain_request(ref, name, arguments, known.attempt))
                decision = _decision_for(ref.tool_call_id, answer)
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
                log.warning("tool_call.sent_again", tool=name, tool_call_id=ref.tool_call_id,
                            attempt=known.attempt + 1, reason=f"decided_{decision.action.value}")
                counted(TOOL_CALLS_REPEATED, {"reason": "decided"})
            if entry is None:  # done meanwhile
                return await self._done_meanwhile(ref, name)
        resent = 0
        while True:
            await self._at("after_intent", name)
            _traced("sent" if entry.attempt == 1 else f"sent_again_{'decided' if decided else 'safe'}", entry)
            with sending(entry.key) as attempt:
                result = await send(arguments)
            if attempt.unanswered is None:
                break
            # Sent, and no answer: it may have acted, exactly like a call cut by a crash.
            log.warning("tool_call.unanswered", tool=name, tool_call_id=ref.tool_call_id,
                        attempt=entry.attempt, why=attempt.unanswered)
            if safe_to_repeat and resent < UNANSWERED_RESENDS:
                resent += 1
                log.warning("tool_call.sent_again", tool=name, tool_call_id=ref.tool_call_id,
                            attempt=entry.attempt + 1, reason="unanswered")
                counted(TOOL_CALLS_REPEATED, {"reason": "safe_to_repeat"})
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
                    interrupt(_uncertain_request(ref, name, arguments, entry.attempt))
                # Sent again on a decision and unanswered again: the model is told that it may
                # have acted, never to call it again as if it had failed (docs/approvals.md).
                result = ToolMessage(
                    unanswered_again_text(attempt.unanswered), tool_call_id=ref.tool_call_id, name=name,
                    status="error", id=str(uuid.uuid4()),
                )
            break  # safe to repeat and still unanswered: its error is the outcome; repeating is harmless
        await self._at("before_outcome", name)
        if decided is not None:
            result.response_metadata = {**result.response_metadata, UNCERTAIN_MARK: decided}
        await self.record_outcome(ref, result.status, result.content)
        counted(TOOL_CALLS, {"outcome": "error" if result.status == "error" else "success"})
        return result

    async def _done_meanwhile(self, ref: CallRef, name: str) -> ToolMessage:
        """The answer of a call whose next attempt found it done (another worker recorded it)."""
        done = await self.entry(ref)
        if done is not None and done.state == DONE:
            _traced("answered", done)
            return self._answer(ref, name, done)
        raise RuntimeError(f"tool call {ref.tool_call_id} changed under its attempt")

    async def recorded(self, ref: CallRef, name: str) -> ToolMessage | None:
        """The call's result as recorded (a cut closing the thread keeps it); None without an outcome.

        Not counted: the call was sent once, and counted ``success`` or ``error`` then; ``answered``
        is a later attempt answered instead of being sent, which this is not."""
        entry = await self.entry(ref)
        if entry is None or entry.state != DONE:
            return None
        log.info("tool_call.kept_from_ledger", tool=name, tool_call_id=ref.tool_call_id,
                 attempts=entry.attempt)
        return _message(ref, name, entry)

    @staticmethod
    def _answer(ref: CallRef, name: str, entry: Entry) -> ToolMessage:
        counted(TOOL_CALLS, {"outcome": "answered"})
        log.info("tool_call.answered_from_ledger", tool=name, tool_call_id=ref.tool_call_id,
                 attempts=entry.attempt)
        return _message(ref, name, entry)


def _message(ref: CallRef, name: str, entry: Entry) -> ToolMessage:
    """The call's recorded outcome as its tool message."""
    return ToolMessage(
        entry.content if entry.content is not None else "", tool_call_id=ref.tool_call_id,
        name=name, status=entry.status or "success", id=str(uuid.uuid4()),
    )


def _traced(state: str, entry: Entry) -> None:
    """What the ledger made of the call, on its span: sent (first attempt), sent again (its tool
    is safe to repeat, or a person decided), answered from the ledger, or not repeated."""
    # Not the key: a trace goes to whoever runs the collector, and the key is what a tool server
    # deduplicates by (the detail and the exports show it to the conversation's owner).
    tracing.annotate({"sophos.tool.ledger": state, "sophos.tool.attempt": entry.attempt})


def _uncertain_request(ref: CallRef, name: str, arguments: dict[str, Any], attempts: int) -> dict[str, Any]:
    """The interrupt that puts a call that may have run to a person (an ``approval`` request)."""
    return {"requests": [{
        "id": ref.tool_call_id, "name": name, "arguments": arguments, "kind": UNCERTAIN_KIND,
        "attempts": attempts,
    }]}


def _decision_for(tool_call_id: str, answer: Any) -> Decision:
    """The decision about this call in a resume value (a list of decisions, as for approvals)."""
    decisions = answer if isinstance(answer, list) else [answer]
    for raw in decisions:
        decision = raw if isinstance(raw, Decision) else decode(Decision, raw)
        if decision.id == tool_call_id:
            return decision
    raise ValueError(f"the decision for tool call {tool_call_id} is missing from {answer!r}")
