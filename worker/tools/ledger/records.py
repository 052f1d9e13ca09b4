"""The ledger's table, ``tool_calls`` (worker/tools/ledger/__init__.py): a call's row, its writes
and its reads, on the worker's application database (either engine).

Only the worker writes it; the API reads it for a conversation's detail and resume plan
(api/conversations/ledger_view.py), the worker's upkeep copies and deletes it (worker/upkeep/).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog
from langchain_core.messages import ToolMessage

from shared.contracts.ledger import DONE, INTENT
from shared.storage import Database
from shared.storage.leases import hold_lease
from shared.storage.schema import now_iso

log = structlog.get_logger(__name__)



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
    #: the MCP task the call's last attempt was made as, and its last known state
    task_id: str | None = None
    task_state: str | None = None


_ENTRY_COLUMNS = "idempotency_key, attempt, state, status, result, task_id, task_state"
_WHERE = "conversation_id = ? AND message_id = ? AND tool_call_id = ?"


def _entry(row: tuple[Any, ...]) -> Entry:
    content = json.loads(row[4]) if row[4] is not None else None
    return Entry(key=str(row[0]), attempt=int(row[1]), state=str(row[2]), status=row[3], content=content,
                 task_id=row[5], task_state=row[6])


def message(ref: CallRef, name: str, entry: Entry) -> ToolMessage:
    """The call's recorded outcome as its tool message."""
    return ToolMessage(
        entry.content if entry.content is not None else "", tool_call_id=ref.tool_call_id,
        name=name, status=entry.status or "success", id=str(uuid.uuid4()),
    )


class Records:
    """The ``tool_calls`` table: each write one transaction, each awaited.

    Test-only fault point (worker/faults.py): ``after_outcome`` is called after each outcome commit.
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
        edit = ""  # a new attempt is a new request: no task yet
        params: list[Any] = [run_id, now_iso()]
        if arguments is not None:
            edit = ", arguments = ?, idempotency_key = ?"
            params += [json.dumps(arguments, ensure_ascii=False), str(uuid.uuid4())]
        async with self.db.transaction() as tx:
            await hold_lease(tx)
            rows = await tx.fetchall(
                "UPDATE tool_calls SET attempt = attempt + 1, run_id = ?, intent_at = ?, task_id = NULL,"
                f" task_state = NULL{edit}"
                f" WHERE {_WHERE} AND state = ? RETURNING {_ENTRY_COLUMNS}",
                (*params, ref.conversation_id, ref.message_id, ref.tool_call_id, INTENT),
            )
        return _entry(rows[0]) if rows else None

    async def record_task(self, ref: CallRef, task_id: str, state: str) -> None:
        """Commit the MCP task the call's attempt is, and its state (while the call has no outcome)."""
        async with self.db.transaction() as tx:
            await tx.execute(
                f"UPDATE tool_calls SET task_id = ?, task_state = ? WHERE {_WHERE} AND state = ?",
                (task_id, state, ref.conversation_id, ref.message_id, ref.tool_call_id, INTENT),
            )

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

    async def recorded(self, ref: CallRef, name: str) -> ToolMessage | None:
        """The call's result as recorded (a cut closing the thread keeps it); None without an outcome.

        Not counted: the call was sent once, and counted ``success`` or ``error`` then; ``answered``
        is a later attempt answered instead of being sent, which this is not."""
        entry = await self.entry(ref)
        if entry is None or entry.state != DONE:
            return None
        log.info("tool_call.kept_from_ledger", tool=name, tool_call_id=ref.tool_call_id,
                 attempts=entry.attempt)
        return message(ref, name, entry)
