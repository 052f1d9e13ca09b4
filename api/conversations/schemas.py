"""Bodies of the conversations' routes: the list, a detail with its messages, exports, rename and delete.

JSON field names are camelCase except in the JSON Lines export, whose lines keep
the checkpointer's own snake_case names. Optional fields are left out, not null.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from api.chat.schemas import Branch
from api.runs.schemas import RunError
from shared.contracts.runs import RunStatus


class ConversationSummary(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    id: str
    title: str
    created_at: str
    updated_at: str
    message_count: int
    status: RunStatus
    #: the last run's error, when it failed or was interrupted
    error: RunError | UnsetType = UNSET
    #: whose it is (the caller's own, unless the caller is an operator)
    owner: str | UnsetType = UNSET


class ConversationInfo(ConversationSummary, kw_only=True):
    resumable: bool


class ConversationList(msgspec.Struct, rename="camel"):
    conversations: list[ConversationSummary]
    #: pass as ``cursor`` for the next (older) page; null on the last page
    next_cursor: str | None = None


class RenameRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Body of ``PATCH /api/conversations/{id}``: the conversation's new title."""

    title: str


class Renamed(msgspec.Struct):
    """A rename: ``renamed`` (200: the worker has written it) or ``renaming`` (202: it will)."""

    conversation: str
    title: str
    status: Literal["renamed", "renaming"]


class DeleteAccepted(msgspec.Struct):
    """202 to a DELETE: the worker deletes the conversation when it takes the job."""

    conversation: str
    status: Literal["deleting"] = "deleting"


class Approval(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    """The user's decision on a tool call that needed approval (recorded by the worker)."""

    action: Literal["approve", "reject", "edit"]
    #: the arguments the model proposed (the call's ``arguments`` are what ran: they differ on edit)
    proposed_arguments: dict[str, Any] | UnsetType = UNSET
    message: str | UnsetType = UNSET
    #: who decided (the decision run's ``startedBy``; absent for a decision recorded before this field)
    decided_by: str | UnsetType = UNSET


class LedgerEntry(msgspec.Struct, omit_defaults=True, kw_only=True):
    """What the ledger of tool effects knows of a call (worker/tools/ledger/): ``done`` (its outcome is
    recorded: it is never sent again) or ``intent`` (sent, or about to be, with no outcome: it may
    have run); how many times it was sent; the idempotency key its requests carried."""

    state: Literal["intent", "done"]
    attempts: int
    key: str
    #: the MCP task the call was made as (worker/tools/tasks.py), absent for a plain call
    task: ToolTask | UnsetType = UNSET


class ToolTask(msgspec.Struct, kw_only=True):
    """The MCP task a call was made as: its id on the tool's server, and the last state the server
    reported (``working``, ``completed``, ``failed``, ``cancelled``), or ``forgotten`` (the server no
    longer knew it when a resume asked)."""

    id: str
    state: str


class ToolCall(msgspec.Struct, omit_defaults=True):
    id: str
    name: str
    arguments: dict[str, Any]
    #: on an assistant message's call that needed approval, once decided
    approval: Approval | UnsetType = UNSET
    #: the ledger's record of the call, once it was sent (absent: never sent)
    ledger: LedgerEntry | UnsetType = UNSET


class PlannedCall(msgspec.Struct, kw_only=True):
    """What a resume will do with one call of the turn it continues: ``answer`` it from the ledger
    (it finished), ``send`` it (never sent), ``resend`` it with its key (it may have run, and its
    tool was safe to repeat), ``task``: ask its server for the result of the MCP task it was made as
    (asking the user only if the server forgot the task), or ``ask`` the user first (it may have run)."""

    id: str
    name: str
    action: Literal["answer", "send", "resend", "task", "ask"]


class PendingCall(msgspec.Struct, omit_defaults=True, kw_only=True):
    """A tool call waiting for a decision. ``kind``: ``approval`` (its tool is configured to need
    one) or ``uncertain`` (it may already have run: the worker stopped while it was being made, or
    its answer did not come;
    ``attempts`` says how many times it was sent). Approve sends it (again, with the same
    idempotency key), edit sends new arguments, reject never sends it."""

    id: str
    name: str
    arguments: dict[str, Any]
    kind: Literal["approval", "uncertain"]
    attempts: int | UnsetType = UNSET


class Message(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    id: str
    role: Literal["user", "assistant", "tool"]
    content: str
    tool_calls: list[ToolCall] | UnsetType = UNSET
    name: str | UnsetType = UNSET
    tool_call_id: str | UnsetType = UNSET
    #: a tool result's status: success, error, or stopped (cut short by a cancel); an
    #: assistant message's: stopped (what was streamed before a cancel), else absent
    status: str | UnsetType = UNSET
    #: the first message of a branch: the thread forks before it (an edit, a regenerate)
    branch: Branch | UnsetType = UNSET


class ConversationDetail(msgspec.Struct, rename="camel"):
    conversation: ConversationInfo
    messages: list[Message]
    resumable: bool
    #: the tool calls waiting for a decision while the conversation is ``waiting``, else null
    pending_approval: list[PendingCall] | None = None
    #: while ``resumable``: what a resume will do with each call of the turn it continues
    resume_plan: list[PlannedCall] | None = None


class CheckpointLine(msgspec.Struct, omit_defaults=True, kw_only=True):
    """One line of the JSON Lines export: a checkpoint and the messages it added."""

    checkpoint_id: str
    parent_checkpoint_id: str | None
    step: int | None
    source: str | None
    run_id: str | None
    created_at: str | None
    #: nodes due to run after this checkpoint, when it can be told
    next: list[str] | UnsetType = UNSET
    messages: list[Message]
    #: the thread forks here: the branch the export follows among the others
    fork: Branch | UnsetType = UNSET
