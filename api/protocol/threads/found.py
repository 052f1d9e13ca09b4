"""A thread as the SDK shows it: its record and its conversation found together, its metadata
(the client's under the server's), and the note a cut run leaves on its state."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from api.conversations.schemas import ConversationInfo
from api.protocol.status import thread_status
from api.protocol.threads.records import Record
from api.runs.schemas import RunError
from shared.contracts.protocol import ASSISTANT_ID, GRAPH_ID
from shared.contracts.runs import RunStatus
from shared.users import LOCAL_USER

#: metadata keys the server sets and a client cannot
SERVER_METADATA = frozenset({"owner", "graph_id", "assistant_id"})


@dataclass(frozen=True, slots=True)
class Found:
    """A thread: its record (None: started on the native routes), its conversation (None: empty)."""

    id: str
    record: Record | None
    info: ConversationInfo | None

    @property
    def status(self) -> str:
        return thread_status(self.info)

    @property
    def owner(self) -> str:
        if self.info is not None and isinstance(self.info.owner, str):
            return self.info.owner  # a conversation's row (or queued run) says whose it is
        return self.record.owner if self.record is not None else LOCAL_USER

    @property
    def metadata(self) -> dict[str, Any]:
        """The client's metadata with the server's (:data:`SERVER_METADATA`) over it."""
        assistant = (self.record.assistant_id if self.record is not None else None) or ASSISTANT_ID
        ran = {"graph_id": GRAPH_ID, "assistant_id": assistant} if self.info is not None else {}
        return {**(self.record.metadata if self.record is not None else {}), **ran, "owner": self.owner}

    def shape(
        self, values: dict[str, Any] | None = None, interrupts: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The SDK's ``Thread``."""
        created = self.record.created_at if self.record is not None else None
        if self.info is not None:
            created = min(created or self.info.created_at, self.info.created_at)
        updated = self.info.updated_at if self.info is not None else created
        return {
            "thread_id": self.id,
            "created_at": created,
            "updated_at": updated,
            "metadata": self.metadata,
            "status": self.status,
            "values": values if values is not None else {},
            "interrupts": interrupts or {},
            "config": {},
            "error": None,
        }



def settable(metadata: dict[str, Any] | None) -> dict[str, Any]:
    """What a client may set of a thread's metadata: all but :data:`SERVER_METADATA`."""
    return {k: v for k, v in (metadata or {}).items() if k not in SERVER_METADATA}



def interrupts_by_task(state: dict[str, Any]) -> dict[str, Any]:
    """A ``Thread``'s ``interrupts``: each task's, by task id."""
    return {t["id"]: t["interrupts"] for t in state["tasks"] if t["interrupts"]}



#: what a thread whose run was cut (a crash, a drain) adds to its head's unfinished task
CUT_HINT = (
    " What was streamed of the step in flight was not kept. Send a new message to go on from the "
    "last step kept, or start a run with no input to resume the step."
)


def with_cut_noted(info: ConversationInfo | None, state: dict[str, Any]) -> dict[str, Any]:
    """``state`` (a head) with its last unfinished task's ``error`` set when the thread's last run
    was cut: a UI (the SDK's ``useStream``) shows it, instead of a bare pending step, as the
    reason the answer it streamed is gone. Other states as they are."""
    tasks = state.get("tasks") or []
    error = info.error if info is not None and info.status == RunStatus.INTERRUPTED else None
    if not tasks or not isinstance(error, RunError) or any(t["interrupts"] or t["error"] for t in tasks):
        return state
    noted = {"error": error.code, "message": f"{error.message}.{CUT_HINT}".replace("..", ".")}
    last = {**tasks[-1], "error": msgspec.json.encode(noted).decode()}
    return {**state, "tasks": [*tasks[:-1], last]}

