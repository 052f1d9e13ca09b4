"""Request and response bodies of the HTTP API (they also make the OpenAPI document).

JSON field names are camelCase except in the JSON Lines export, whose lines keep
the checkpointer's own snake_case names. Optional fields are left out, not null.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from shared.contracts.wire import JobKind, RunStatus


class DecisionBody(msgspec.Struct, forbid_unknown_fields=True):
    """One decision on a pending tool call; ``arguments`` replaces the call's for ``edit``."""

    id: str
    action: Literal["approve", "reject", "edit"]
    arguments: dict[str, Any] | None = None
    #: for ``reject``: told to the model with the rejection
    message: str | None = None


class ChatRequest(msgspec.Struct):
    """Body of ``POST /api/chat``: a new message, ``resume: true`` with a conversation, or decisions.

    Permissive on purpose: wrong types are rejected by validation, the rest is
    checked by hand in the order the contract gives.
    """

    message: str | None = None
    conversation: str | None = None
    resume: bool = False
    #: with a conversation waiting for an approval: one decision per pending request
    decisions: list[DecisionBody] | None = None
    #: with ``message``: the id of an earlier user message this one replaces (an edit)
    replaces: str | None = None
    #: the id of an answer (or of the user message it answers) to answer again
    regenerate: str | None = None


class ActingCall(msgspec.Struct, kw_only=True):
    """A tool call that may have acted on the world (its tool is not known to be safe to repeat:
    read-only or idempotent) and was sent: left on a branch, its effects stay."""

    id: str
    name: str
    arguments: dict[str, Any]


class ChatAccepted(msgspec.Struct, rename="camel", omit_defaults=True):
    conversation: str
    run: str
    #: an edit or a regenerate: the calls of the branch it leaves that may have acted
    abandoned_calls: list[ActingCall] | UnsetType = UNSET


class BranchRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Body of ``POST /api/conversations/{id}/branch``: the first message of the branch to follow
    (an id from a message's ``branch.alternatives``)."""

    message: str


class Alternative(msgspec.Struct, rename="camel", kw_only=True):
    """One branch from a fork point: the message it starts with, and the tool calls made on it
    that may have acted on the world (their effects stay whichever branch is followed)."""

    message: str
    content: str
    acting_calls: list[ActingCall]


class Branch(msgspec.Struct, rename="camel", kw_only=True):
    """On the first message after a fork point: which of its branches the conversation follows
    (``index``, from 1) out of ``count``; switch with ``POST /api/conversations/{id}/branch``
    ``{message: alternatives[i].message}``."""

    index: int
    count: int
    alternatives: list[Alternative]


class ErrorDetail(msgspec.Struct):
    code: str
    message: str


class ErrorBody(msgspec.Struct):
    error: ErrorDetail


class RunError(msgspec.Struct):
    code: str
    message: str


class ConversationSummary(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    id: str
    title: str
    created_at: str
    updated_at: str
    message_count: int
    status: RunStatus
    #: the last run's error, when it failed or was interrupted
    error: RunError | UnsetType = UNSET


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


class LedgerEntry(msgspec.Struct, omit_defaults=True, kw_only=True):
    """What the ledger of tool effects knows of a call (worker/tools/ledger.py): ``done`` (its outcome is
    recorded: it is never sent again) or ``intent`` (sent, or about to be, with no outcome: it may
    have run); how many times it was sent; the idempotency key its requests carried."""

    state: Literal["intent", "done"]
    attempts: int
    key: str


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
    tool was safe to repeat), or ``ask`` the user first (it may have run)."""

    id: str
    name: str
    action: Literal["answer", "send", "resend", "ask"]


class PendingCall(msgspec.Struct, omit_defaults=True, kw_only=True):
    """A tool call waiting for a decision. ``kind``: ``approval`` (its tool is configured to need
    one) or ``uncertain`` (it may already have run: the worker stopped while it was being made;
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


def _ms(description: str) -> msgspec.Meta:
    return msgspec.Meta(ge=0, description=f"Milliseconds {description}")


class RunBreakdown(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    """Where a finished run spent its time, in milliseconds. ``modelMs``, ``toolsMs`` and
    ``databaseMs`` are within ``durationMs``: the wall time with a chat-model call, a tool call
    or a checkpoint write in flight (calls of one part made at once count once); the rest of the
    duration is the worker's own work (events, the outcome's write). ``queuedMs`` came before it."""

    queued_ms: Annotated[int, _ms("from its acceptance to its start by a worker (waitedMs)")] | UnsetType = (
        UNSET
    )
    model_ms: Annotated[int, _ms("with a chat-model call in flight")]
    tools_ms: Annotated[int, _ms("with a tool call in flight (a step's calls made at once count once)")]
    database_ms: Annotated[int, _ms("with a checkpoint write in flight (a step's, or a task's writes)")]


class RunInfo(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    id: str
    conversation: str
    kind: JobKind
    status: RunStatus
    enqueued_at: str | None
    started_at: str | None
    finished_at: str | None
    duration_ms: int | None
    step_count: int
    error: RunError | UnsetType = UNSET
    #: 0-based place among the queued runs, while queued
    position: int | UnsetType = UNSET
    #: time between enqueue and start (or now, while queued; or cancellation, if cancelled queued)
    waited_ms: int | UnsetType = UNSET
    #: while running: the node of the current step and the time since the run started
    node: str | UnsetType = UNSET
    elapsed_ms: int | UnsetType = UNSET
    #: a cancel was asked for and the worker has not stopped the run yet
    cancel_requested: bool | UnsetType = UNSET
    #: once finished, where its time went (absent for a run no worker timed: one ended by
    #: recovery after a crash, or one from before this field)
    breakdown: Annotated[RunBreakdown, msgspec.Meta(description=(
        "Once finished, where its time went; absent for a run no worker timed (ended by recovery "
        "after a crash, or recorded before this field)"
    ))] | UnsetType = UNSET


class WorkerInfo(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    """The workers as their heartbeats tell it: alive or not, how many, and of the newest
    beat (else the last one seen) since when and last seen when."""

    alive: bool
    pid: int | UnsetType = UNSET
    #: when the live worker (or the last one seen) started
    started_at: str | UnsetType = UNSET
    last_beat_at: str | UnsetType = UNSET
    heartbeat_age_ms: int | UnsetType = UNSET
    #: runs it executes at once (``WORKER_CONCURRENCY``)
    concurrency: int | UnsetType = UNSET
    #: live workers (the other fields tell of the newest beat among them)
    count: int | UnsetType = UNSET


class AgentTool(msgspec.Struct):
    """A tool the agent can call: ``server__tool`` and the first line of what it does."""

    name: str
    description: str


class AgentInfo(msgspec.Struct, rename="camel"):
    """What answers: the model and the tools, as the newest live worker's heartbeat says (else
    the last beat seen; the model from this process's OLLAMA_MODEL when no worker ever beat)."""

    model: str
    tools: list[AgentTool]
    worker_alive: bool


class RunList(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    runs: list[RunInfo]
    #: pass as ``cursor`` for the next (older) page; absent on the last page
    next_cursor: str | UnsetType = UNSET
    #: absent when Redis cannot be asked
    worker: WorkerInfo | UnsetType = UNSET


class Health(msgspec.Struct):
    status: Literal["ok"] = "ok"


class ReadinessChecks(msgspec.Struct):
    redis: bool
    database: bool
    worker: bool
    model: bool
    #: each MCP server of the live worker: "up", or why it is not. A server that is down
    #: costs only its own tools (they answer the model with an error), so it is named
    #: here but does not make the service unready.
    tool_servers: dict[str, str] = msgspec.field(default_factory=dict, name="toolServers")

    def missing(self) -> list[str]:
        return [name for name in ("redis", "database", "worker", "model") if not getattr(self, name)]


class Ready(msgspec.Struct):
    status: Literal["ready"]
    checks: ReadinessChecks
    #: the worker's heartbeat: alive, since when (absent when Redis cannot be asked)
    worker: WorkerInfo | UnsetType = UNSET


class NotReadyBody(msgspec.Struct):
    error: ErrorDetail
    checks: ReadinessChecks
    worker: WorkerInfo | UnsetType = UNSET
