"""What crosses Redis between the API and the worker: jobs, events, keys.

The scripts run on these keys, and the terminal event's shape, are in
:mod:`shared.redis.scripts`.

Both ends serialize with :func:`dumps` / :func:`loads` (JSON, by ``json`` or msgspec:
:func:`use_json_codec`). Nothing read from
Redis is ever unpickled, so write access to Redis is not code execution.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import msgspec

# --- the agent graph's nodes (worker/agent/graph.py), as the thread and the protocol's events name them

AGENT = "agent"
TOOLS = "tools"
#: asks the user to approve, edit or reject the turn's tool calls (worker/agent/graph.py)
APPROVAL = "approval"

# --- run and error vocabulary -------------------------------------------------


class RunStatus(enum.StrEnum):
    QUEUED = "queued"  # in Redis only
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    CANCELLED = "cancelled"  # by POST /api/runs/{id}/cancel, queued or running
    #: paused for an approval of tool calls: over (it holds nothing), a decision starts the next run
    WAITING = "waiting"

    @property
    def finished(self) -> bool:
        return self in (
            RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.INTERRUPTED, RunStatus.CANCELLED,
            RunStatus.WAITING,
        )


class RunErrorCode(enum.StrEnum):
    MODEL_UNAVAILABLE = "MODEL_UNAVAILABLE"
    RECURSION_LIMIT = "RECURSION_LIMIT"
    AGENT_FAILURE = "AGENT_FAILURE"
    INTERRUPTED = "INTERRUPTED"
    DATABASE_UNAVAILABLE = "DATABASE_UNAVAILABLE"
    RUN_NOT_RESUMABLE = "RUN_NOT_RESUMABLE"


class JobKind(enum.StrEnum):
    RUN = "run"  # a new message
    RESUME = "resume"  # continue the thread from its last checkpoint
    DECIDE = "decide"  # continue a thread waiting for an approval with the user's decisions
    #: make another branch of the thread the current one (``checkpoint_id``: its latest checkpoint)
    SWITCH = "switch"


# --- jobs -----------------------------------------------------------------------

#: The one arq function the worker registers; the job id is the run id.
JOB_FUNCTION = "execute_run"


@dataclass(frozen=True, slots=True)
class RunJob:
    """Payload of a run or resume job. The arq job id is ``run_id``."""

    run_id: str
    conversation_id: str
    kind: JobKind
    message: str | None
    enqueued_at: float
    new_conversation: bool = False
    #: a ``decide`` job's decisions, one per pending request (:class:`Decision` as dicts)
    decisions: tuple[dict[str, Any], ...] | None = None
    #: the W3C trace context of the request that enqueued it (tracing on: shared/tracing.py)
    traceparent: str | None = None
    #: the checkpoint the run starts from instead of the thread's latest: where an edit or a
    #: regenerate forks, the head of the branch the conversation follows, or (``switch``) the
    #: head of the branch it is to follow (Branches, docs/api.md)
    checkpoint_id: str | None = None
    #: accepted with ``multitask_strategy`` ``enqueue``: it may be waiting behind the conversation's
    #: active run, and then claims the conversation when the worker takes it (worker/run/turns.py)
    may_wait: bool = False
    #: whose conversation it is (a new one: whoever asked), and who asked for this run (an
    #: operator may ask on a user's conversation); DESIGN.md "People and what they may touch"
    owner: str = "local"
    started_by: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if self.decisions is None:
            del data["decisions"]  # jobs without decisions look as they always did
        else:
            data["decisions"] = list(self.decisions)
        if self.traceparent is None:
            del data["traceparent"]  # nor do jobs enqueued without tracing
        if self.checkpoint_id is None:
            del data["checkpoint_id"]
        if not self.may_wait:
            del data["may_wait"]
        if self.started_by is None or self.started_by == self.owner:
            data.pop("started_by")
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunJob:
        decisions = data.get("decisions")
        return cls(
            run_id=str(data["run_id"]),
            conversation_id=str(data["conversation_id"]),
            kind=JobKind(data["kind"]),
            message=data.get("message"),
            enqueued_at=float(data["enqueued_at"]),
            new_conversation=bool(data.get("new_conversation", False)),
            decisions=tuple(dict(d) for d in decisions) if decisions is not None else None,
            traceparent=str(data["traceparent"]) if data.get("traceparent") else None,
            checkpoint_id=data.get("checkpoint_id"),
            may_wait=bool(data.get("may_wait", False)),
            owner=str(data.get("owner", "local")),
            started_by=data.get("started_by"),
        )


class DecisionAction(enum.StrEnum):
    APPROVE = "approve"
    REJECT = "reject"
    EDIT = "edit"


@dataclass(frozen=True, slots=True)
class Decision:
    """The user's answer to one pending tool call (``id`` = the tool call id)."""

    id: str
    action: DecisionAction
    arguments: dict[str, Any] | None = None
    message: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "action": self.action.value, "arguments": self.arguments, "message": self.message,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Decision:
        arguments = data.get("arguments")
        return cls(
            id=str(data["id"]), action=DecisionAction(data["action"]),
            arguments=dict(arguments) if arguments is not None else None, message=data.get("message"),
        )


#: The arq function that deletes a conversation (DELETE /api/conversations/{id}).
DELETE_FUNCTION = "delete_conversation"
_DELETE_CLAIM = "delete:"


@dataclass(frozen=True, slots=True)
class DeleteJob:
    """Payload of a delete job. Its arq job id, and its claim in ``ACTIVE_RUNS``, is ``claim``."""

    conversation_id: str
    claim: str
    enqueued_at: float
    #: why: a client's DELETE (``request``) or ``CONVERSATION_RETENTION_DAYS`` (``retention``)
    reason: str = "request"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeleteJob:
        return cls(
            str(data["conversation_id"]), str(data["claim"]), float(data["enqueued_at"]),
            str(data.get("reason") or "request"),
        )


def delete_claim(job_id: str) -> str:
    """What a delete holds ``ACTIVE_RUNS`` with (and its arq job id): never a run id, so a
    run cannot be accepted for the conversation while it is being deleted."""
    return f"{_DELETE_CLAIM}{job_id}"


def is_delete_claim(holder: str) -> bool:
    return holder.startswith(_DELETE_CLAIM)


def deleted_key(claim: str) -> str:
    """List the worker pushes the delete's outcome to (``deleted`` or ``failed: ...``), briefly kept."""
    return f"sophos:deleted:{claim}"


#: The arq function that renames a conversation (PATCH /api/conversations/{id}).
RENAME_FUNCTION = "rename_conversation"
#: The longest title a rename may give (characters, after whitespace is collapsed).
TITLE_MAX_CHARS = 200


@dataclass(frozen=True, slots=True)
class RenameJob:
    """Payload of a rename job; ``job_id`` (``rename:<uuid>``) is its arq job id.

    Safe twice: it writes the same title again. It holds no claim in ``ACTIVE_RUNS``: a run
    never writes a title that exists (worker/store.py ``start_run``), so a rename and a run
    of one conversation may go in either order.
    """

    conversation_id: str
    title: str
    job_id: str
    enqueued_at: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RenameJob:
        return cls(
            str(data["conversation_id"]), str(data["title"]), str(data["job_id"]), float(data["enqueued_at"])
        )


def renamed_key(job_id: str) -> str:
    """List the worker pushes a rename's outcome to (``renamed``, ``gone`` or ``failed: ...``)."""
    return f"sophos:renamed:{job_id}"


# --- events ---------------------------------------------------------------------


class EventType(enum.StrEnum):
    TOKEN = "token"
    TRACE = "trace"
    END = "end"
    CHAT_ERROR = "chat-error"
    #: the tool calls waiting for a decision; ``end`` with status ``waiting`` follows
    APPROVAL = "approval"

    @property
    def terminal(self) -> bool:
        return self in (EventType.END, EventType.CHAT_ERROR)


def text_of(content: Any) -> str:
    """The text of a message's content (a string, or a list of content blocks).

    What a ``token`` event carries, what a tool result's trace carries, and what
    the API shows of a stored message: one reading of LangChain's content shapes.
    """
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part if isinstance(part, str) else str(part.get("text", ""))
            for part in content
            if isinstance(part, str) or (isinstance(part, dict) and part.get("type") == "text")
        )
    return "" if content is None else str(content)


# --- Redis keys -----------------------------------------------------------------

QUEUE_NAME = "sophos:queue"
#: hash conversation_id -> run_id of its queued or running run; HSETNX is the lock
#: that makes "one run per conversation" atomic across API processes.
ACTIVE_RUNS = "sophos:active"
#: list the submit script pushes to, so an idle worker blocked on BLPOP wakes at once
WAKE_LIST = "sophos:wake"
#: key with a short TTL, rewritten by every live worker's beat (the last writer's):
#: {id, host, pid, started_at, beat_at, ...}. The aggregate older readers know; each
#: worker's own is ``worker_heartbeat_key``.
WORKER_HEARTBEAT = "sophos:worker:heartbeat"
#: sorted set worker id -> Redis time of its last beat; trimmed of members older than the
#: heartbeat's TTL at each beat, and expiring with it: the workers that may be alive
WORKERS = "sophos:workers"


def worker_heartbeat_key(worker_id: str) -> str:
    """One worker's heartbeat (the body of ``WORKER_HEARTBEAT``), with the same short TTL."""
    return f"{WORKER_HEARTBEAT}:{worker_id}"


def run_key(run_id: str) -> str:
    """Hash describing a queued run (conversation, kind, title, enqueued_at)."""
    return f"sophos:run:{run_id}"


#: How long a request's ``Idempotency-Key`` keeps its first answer.
IDEMPOTENCY_TTL_SECONDS = 24 * 3600


def idempotency_key(key: str, owner: str = "local") -> str:
    """String: the first answer to ``owner``'s ``POST /api/chat`` with this ``Idempotency-Key``
    (a key is its user's: another user's same key is another key). A NUL, which neither a user
    name nor a key can hold, keeps ``a:b`` + ``c`` apart from ``a`` + ``b:c``."""
    return f"sophos:idem:{owner}\x00{key}"


def conversation_deleted_key(conversation_id: str) -> str:
    """String, kept ``IDEMPOTENCY_TTL_SECONDS``: the conversation was deleted.

    Written by the delete (worker/upkeep/deletion.py) before it frees the conversation: an
    ``Idempotency-Key`` answer naming it is then refused, not replayed (api/chat/idempotency.py).
    """
    return f"sophos:conversation-deleted:{conversation_id}"


def events_key(run_id: str) -> str:
    """Redis Stream holding the run's events; entry ids are ``<n>-0``."""
    return f"sophos:events:{run_id}"


#: key without expiry, rewritten with each heartbeat: the last beat survives the worker
WORKER_LAST_BEAT = "sophos:worker:last-beat"
#: sorted set run_id -> enqueue time (ms) of the runs cancelled while queued; their
#: ``run_key`` hash (with ``status`` and ``cancelled_at``) is the record, kept
#: ``CANCELLED_RETENTION_SECONDS``.
CANCELLED_RUNS = "sophos:cancelled"
CANCELLED_RETENTION_SECONDS = 7 * 24 * 3600


def cancelled_run_key(conversation_id: str) -> str:
    """String: the conversation's last run cancelled while queued, kept ``CANCELLED_RETENTION_SECONDS``.

    That run never reaches SQLite, so the conversation's row still names the run
    before it; the SSE relay looks here to stream the newer of the two.
    """
    return f"sophos:cancelled-run:{conversation_id}"


def waiting_key(conversation_id: str) -> str:
    """List of the conversation's runs accepted behind its active run (``multitask_strategy``
    ``enqueue``), oldest first: each claims the conversation in this order when the worker takes
    its job (worker/run/turns.py). Kept no longer than its newest run's job record."""
    return f"sophos:waiting:{conversation_id}"


def taken_key(run_id: str) -> str:
    """Which worker took the run's job (PostgreSQL, several workers): set before its run is
    recorded, so a live worker's sweep can free the conversation of a run whose taker died
    in between (arq's in-progress marker would hold it for a day)."""
    return f"sophos:taken:{run_id}"


#: How long the record of who took a run is kept: past any wait for its row.
TAKEN_SECONDS = 3600


def cancel_key(run_id: str) -> str:
    """Set by the API to ask the worker to stop a started run (read again after a crash)."""
    return f"sophos:cancel:{run_id}"


#: pub/sub channel the API publishes a run's id on, with ``cancel_key``: the worker,
#: subscribed for its life, cuts the run at once
CANCEL_CHANNEL = "sophos:cancels"
#: ``response_metadata`` key set on the messages a cancel wrote into a thread (the
#: answer cut short, the tool results of calls cut short)
STOPPED_MARK = "stopped"
#: ``response_metadata`` key of an answer whose tool calls needed approval: each call's decision
APPROVALS_MARK = "approvals"


def model_call_key(conversation_id: str) -> str:
    """The task id of the conversation's last model call started (worker/agent/model_calls.py)."""
    return f"sophos:model-call:{conversation_id}"


#: how long a model call's mark is kept: a resume later than that is not counted as a repeat
#: (as long as the longest-kept key, a cancelled run's record: what Redis holds stays bounded)
MODEL_CALL_MARK_TTL = 7 * 24 * 3600


def progress_key(run_id: str) -> str:
    """Hash the worker keeps while a run is running: {node, step, started_at, updated_at}."""
    return f"sophos:progress:{run_id}"


#: sorted set thread id -> creation time (ms) of the threads made by ``POST /threads`` (the
#: Agent Protocol, api/protocol/): the ones with no conversation yet are listed from here
PROTOCOL_THREADS = "sophos:protocol:threads"


def protocol_thread_key(thread_id: str) -> str:
    """Hash of a thread made by ``POST /threads``: {created_at, metadata (JSON)}.

    A thread created empty has no conversation until its first run: this record is how it
    exists meanwhile, and where its metadata stays after (the database has no column for it).
    Deleted with its conversation (worker/upkeep/deletion.py) or by ``DELETE /threads/{id}``.
    """
    return f"sophos:protocol:thread:{thread_id}"


def protocol_run_key(run_id: str) -> str:
    """Hash of a run created through the Agent Protocol: {metadata, stream_mode} (JSON), kept
    ``PROTOCOL_RUN_RETENTION_SECONDS``; a run without one shows the defaults."""
    return f"sophos:protocol:run:{run_id}"


PROTOCOL_RUN_RETENTION_SECONDS = 7 * 24 * 3600


def arq_job_key(run_id: str) -> str:
    return f"arq:job:{run_id}"


def arq_in_progress_key(run_id: str) -> str:
    return f"arq:in-progress:{run_id}"


def arq_retry_key(run_id: str) -> str:
    return f"arq:retry:{run_id}"


# --- serialization --------------------------------------------------------------


def _json_dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, default=_default).encode()


def _msgspec_dumps(obj: Any) -> bytes:
    try:
        return _ENCODER.encode(obj)
    except (TypeError, ValueError, OverflowError):
        # What msgspec refuses (dict keys that are not str or numbers), json's rules settle;
        # an object neither can encode raises json's TypeError, as before.
        return _json_dumps(obj)


def _msgspec_loads(raw: bytes | str) -> Any:
    try:
        return _DECODER.decode(raw)
    except msgspec.DecodeError:
        # NaN and Infinity, which json accepts; json raises for what is not JSON at all.
        return json.loads(raw)


def _default(obj: Any) -> Any:
    if isinstance(obj, BaseException):
        # arq stores a failed job's exception as its result; keep it as text.
        return f"{type(obj).__name__}: {obj}"
    if isinstance(obj, enum.Enum):
        return obj.value
    raise TypeError(f"cannot serialize {type(obj).__name__}")


_ENCODER = msgspec.json.Encoder(enc_hook=_default)
_DECODER = msgspec.json.Decoder()
_CODECS: dict[str, tuple[Callable[[Any], bytes], Callable[[bytes | str], Any]]] = {
    "json": (_json_dumps, json.loads),
    "msgspec": (_msgspec_dumps, _msgspec_loads),
}
_codec = "json"
_dumps, _loads = _CODECS[_codec]


def use_json_codec(name: str) -> None:
    """Encode and decode with ``json`` or ``msgspec`` from now on, in this process (JSON_CODEC).

    msgspec's output parses the same as json's: compact, UTF-8, the same strings and
    numbers (floats may be spelled differently, ``1e16`` for ``1e+16``) and
    big integers kept exact both ways. One difference: NaN and Infinity, which json writes
    as bare ``NaN`` (no JSON parser of a browser takes it), become ``null``.
    """
    global _codec, _dumps, _loads
    _dumps, _loads = _CODECS[name]
    _codec = name


def json_codec() -> str:
    return _codec


def dumps(obj: Any) -> bytes:
    return _dumps(obj)


def loads(raw: bytes | str) -> Any:
    return _loads(raw)
