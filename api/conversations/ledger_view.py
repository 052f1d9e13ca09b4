"""What the ledger of tool effects (worker/tools/ledger/, table ``tool_calls``) tells a reader of a
conversation: each call's state, attempts and key, and what a resume will do with the calls of
the turn it continues. Read by the API (api/store.py ``tool_calls``), never written here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from msgspec import UNSET

from api.conversations.schemas import LedgerEntry, Message, PlannedCall, ToolTask
from shared.contracts.ledger import DONE, INTENT, TASK_FORGOTTEN

#: the columns :meth:`LedgerRow.from_row` reads, in order
LEDGER_COLUMNS = (
    "message_id, tool_call_id, tool, idempotency_key, attempt, state, safe_to_repeat, task_id, task_state"
)


@dataclass(frozen=True, slots=True)
class LedgerRow:
    message_id: str
    tool_call_id: str
    tool: str
    key: str
    attempts: int
    state: str
    #: the tool was safe to repeat when the call was made (None: recorded before that was kept)
    safe_to_repeat: bool | None
    #: the MCP task the call was made as, and its last known state (worker/tools/tasks.py)
    task_id: str | None = None
    task_state: str | None = None

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> LedgerRow:
        return cls(
            message_id=str(row[0]), tool_call_id=str(row[1]), tool=str(row[2]), key=str(row[3]),
            attempts=int(row[4]), state=str(row[5]), safe_to_repeat=None if row[6] is None else bool(row[6]),
            task_id=row[7], task_state=row[8],
        )


def annotate(messages: list[Message], rows: list[LedgerRow]) -> None:
    """Give each assistant message's tool calls what the ledger knows of them."""
    by_call = {(r.message_id, r.tool_call_id): r for r in rows}
    for message in messages:
        if message.role != "assistant" or message.tool_calls is UNSET:
            continue
        for call in message.tool_calls:
            row = by_call.get((message.id, call.id))
            if row is not None:
                call.ledger = LedgerEntry(
                    state=DONE if row.state == DONE else INTENT, attempts=row.attempts, key=row.key,
                    task=ToolTask(id=row.task_id, state=row.task_state or "working")
                    if row.task_id is not None else UNSET,
                )


def resume_plan(messages: list[Message], rows: list[LedgerRow]) -> list[PlannedCall]:
    """What a resume does with each call of the last assistant message that has no result yet."""
    last = next((i for i in range(len(messages) - 1, -1, -1) if messages[i].role == "assistant"), None)
    if last is None:
        return []
    calls = messages[last].tool_calls
    if calls is UNSET:
        return []
    answered = {m.tool_call_id for m in messages[last + 1:] if m.role == "tool"}
    by_call = {(r.message_id, r.tool_call_id): r for r in rows}
    plan = []
    action: Literal["answer", "send", "resend", "task", "ask"]
    for call in calls:
        if call.id in answered:
            continue
        row = by_call.get((messages[last].id, call.id))
        if row is None:
            action = "send"
        elif row.state == DONE:
            action = "answer"
        elif row.task_id is not None and row.task_state != TASK_FORGOTTEN:
            action = "task"
        else:
            action = "resend" if row.safe_to_repeat else "ask"
        plan.append(PlannedCall(id=call.id, name=call.name, action=action))
    return plan
