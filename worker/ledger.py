"""The ledger of tool effects: where a tool call is recorded before and after it acts.

A tool call is the one part of a run that acts on the world, and LangGraph's own record of
it is not enough: it saves a finished task's writes in the background (``put_writes`` is not
awaited even with ``durability="sync"``, langgraph#8039 / #8234, checked on langgraph
1.2.24), so a worker killed just after a call returned can lose the record and run the call
again on resume. The ledger (table ``tool_calls``, shared/schema.py migration 5) decides
instead. For each call of an assistant message, in :meth:`Ledger.run`:

1. **Intent**, committed and awaited before the request leaves: conversation, run, message,
   tool call id, tool, arguments, idempotency key, attempt number. On PostgreSQL the same
   transaction checks the run's lease (:func:`shared.storage.postgres.hold_lease`): a worker
   that lost its run sends nothing.
2. The request, with the key in its ``_meta`` as ``"sophos/idempotency-key"``
   (:data:`IDEMPOTENCY_META_KEY`; worker/mcp_tools.py reads :func:`request_meta`).
3. **Outcome** (the result or the error the model is given), committed before the call's
   task returns. Not fenced: it records a fact, whoever holds the run now.

A call whose outcome is recorded is answered from the ledger on every later attempt, and
never sent again, whatever LangGraph's writes say.

The key is made once per call (a random UUID, on its first intent) and kept on every attempt;
every other call gets another. A tool server can deduplicate with it (docs: tool authors).

Known gap, closed by part 4 of issue 29: a call with an intent and no outcome (the worker
died while it was sent, or between its result and the outcome's commit) is *uncertain*. For
now it is sent again with the same key and the next attempt number, whatever the tool; it
should instead be sent again only when the tool is safe to repeat, and otherwise be put to
the user as an approval of ``"kind": "uncertain"``. ``attempt`` is stored so that decision
can tell a first send from a repeat.
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

from shared.schema import now_iso
from shared.storage import Database
from shared.storage.postgres import hold_lease

log = structlog.get_logger(__name__)

#: the key of a ``tools/call`` request's ``_meta`` that carries the call's idempotency key
IDEMPOTENCY_META_KEY = "sophos/idempotency-key"

#: the states of a ledger row
INTENT = "intent"
DONE = "done"

#: the ``_meta`` of the ``tools/call`` request being made in this context (set by :meth:`Ledger.run`)
_REQUEST_META: ContextVar[dict[str, Any] | None] = ContextVar("sophos_request_meta", default=None)


def request_meta() -> dict[str, Any] | None:
    """The ``_meta`` for a ``tools/call`` request made now: the call's idempotency key, if any."""
    return _REQUEST_META.get()


@contextmanager
def _meta(key: str) -> Iterator[None]:
    token = _REQUEST_META.set({IDEMPOTENCY_META_KEY: key})
    try:
        yield
    finally:
        _REQUEST_META.reset(token)


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

    ``after_outcome`` is called after each outcome commit (the test-only kill point,
    worker/faults.py).
    """

    def __init__(self, db: Database, *, after_outcome: Callable[[], None] | None = None) -> None:
        self.db = db
        self.after_outcome = after_outcome

    async def entry(self, ref: CallRef) -> Entry | None:
        rows = await self.db.fetchall(
            f"SELECT {_ENTRY_COLUMNS} FROM tool_calls WHERE {_WHERE}",
            (ref.conversation_id, ref.message_id, ref.tool_call_id),
        )
        return _entry(rows[0]) if rows else None

    async def record_intent(self, ref: CallRef, run_id: str, tool: str, arguments: dict[str, Any]) -> Entry:
        """Commit the intent to send the call now; the row as it stands after.

        A first attempt inserts the row with a new key; a later one (intent without outcome)
        counts the attempt and keeps the key. A call already done is left as it is: the
        returned entry is ``DONE`` and the caller answers from it. Raises ``LeaseLost`` on
        PostgreSQL when the run is no longer this worker's.
        """
        now = now_iso()
        async with self.db.transaction() as tx:
            await hold_lease(tx)
            rows = await tx.fetchall(
                "INSERT INTO tool_calls (conversation_id, message_id, tool_call_id, run_id, tool, arguments,"
                " idempotency_key, attempt, state, intent_at) VALUES (?, ?, ?, ?, ?, ?, ?, 1, ?, ?)"
                " ON CONFLICT (conversation_id, message_id, tool_call_id) DO UPDATE SET"
                " attempt = tool_calls.attempt + 1, run_id = excluded.run_id, intent_at = excluded.intent_at"
                f" WHERE tool_calls.state = ? RETURNING {_ENTRY_COLUMNS}",
                (ref.conversation_id, ref.message_id, ref.tool_call_id, run_id, tool,
                 json.dumps(arguments, ensure_ascii=False), str(uuid.uuid4()), INTENT, now, INTENT),
            )
            if not rows:  # done already: not updated
                rows = await tx.fetchall(
                    f"SELECT {_ENTRY_COLUMNS} FROM tool_calls WHERE {_WHERE}",
                    (ref.conversation_id, ref.message_id, ref.tool_call_id),
                )
        return _entry(rows[0])

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
        send: Callable[[], Awaitable[ToolMessage]],
    ) -> ToolMessage:
        """The call's result: from the ledger if it is done, else by ``send()`` between intent and outcome.

        ``send`` makes the request (its ``_meta`` carries the key, :func:`request_meta`) and
        returns the ToolMessage the model gets, an error included. A cancellation or a crash
        inside it leaves the intent without outcome.
        """
        entry = await self.record_intent(ref, run_id, call["name"], call.get("args") or {})
        if entry.state == DONE:
            log.info("tool_call.answered_from_ledger", tool=call["name"], tool_call_id=ref.tool_call_id,
                     attempts=entry.attempt)
            return ToolMessage(
                entry.content if entry.content is not None else "", tool_call_id=ref.tool_call_id,
                name=call["name"], status=entry.status or "success", id=str(uuid.uuid4()),
            )
        if entry.attempt > 1:
            # The known gap (module docstring): sent again without asking, same key.
            log.warning("tool_call.sent_again", tool=call["name"], tool_call_id=ref.tool_call_id,
                        attempt=entry.attempt)
        with _meta(entry.key):
            result = await send()
        await self.record_outcome(ref, result.status, result.content)
        return result
