"""A run's events: their types, the text a ``token`` carries, and the events that end a run's
stream, as frozen structs: one shape for every producer.

A run's stream ends with ``end`` (it stopped as it should: completed, cancelled as
asked, or waiting for a decision) or ``chat-error`` (anything else); a run that
pauses for an approval publishes ``approval`` just before its ``end``. The worker's
ending (worker/run/outcome/ending.py, through :data:`shared.redis.scripts.END_RUN_LUA`), the
scripts that end a run that never started (the queued cancel, the sweep) and the
relay that rebuilds an ending from a run's row (api/chat/relay.py) all build these
shapes from here; the Lua side (``END_LUA`` in shared/redis/scripts/ending.py) builds the
same fields, and tests/test_redis_protocol.py holds every producer to them.

Stream entries (:func:`entry_id`, :func:`entry_span`, :func:`entry_fields`, :func:`entry_events`):
event ``n`` alone is entry ``n-0`` with fields ``type`` and ``data`` (its JSON). Tokens the worker
produced within a few milliseconds of each other share one entry (issue 45): tokens ``f``..``f+k``
are entry ``f-k``, ``type`` ``token``, ``data`` the JSON array of their texts. The entry's first
number is its first event's id and its sequence counts the events after it, so the stream's ids
still rise with the events' and a reader finds the entry holding event ``n`` as the last one at or
before ``n-<max>`` (api/chat/feed.py). Every SSE event keeps its own id ``n``.
"""

from __future__ import annotations

import enum
from typing import Any

import msgspec

from shared.contracts.codec import dumps, loads
from shared.contracts.runs import RunStatus


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


#: A run with one of these outcomes stopped as it should: its stream ends with ``end``.
ENDS_NORMALLY = (RunStatus.COMPLETED, RunStatus.CANCELLED, RunStatus.WAITING)

#: A run's events and its terminal event reach Redis within this many seconds of its
#: outcome being recorded, unless Redis is away (worker/run/outcome/ending.py: the pre-commit flush, the
#: publisher's close and the ending's script are each bounded, and their bounds add up to
#: less). Until then a relay that finds the run finished and its stream short waits for the
#: stream rather than taking it as expired (api/chat/relay.py).
ENDING_PUBLISHED_WITHIN = 10.0


class End(msgspec.Struct, frozen=True, kw_only=True):
    """``end``: the run stopped as it should."""

    conversation: str
    run: str
    status: str


class ChatError(msgspec.Struct, frozen=True, kw_only=True):
    """``chat-error``: the last event of a run that failed or was interrupted."""

    conversation: str
    run: str
    status: str
    code: str | None
    message: str | None


class Approval(msgspec.Struct, frozen=True, kw_only=True):
    """``approval``: the tool calls waiting for a decision; ``end`` (``waiting``) follows."""

    conversation: str
    run: str
    requests: list[dict[str, Any]]


Terminal = End | ChatError


def ends_normally(status: str) -> bool:
    return status in ENDS_NORMALLY


def terminal_event(
    conversation_id: str, run_id: str, status: str, code: str | None = None, message: str | None = None
) -> Terminal:
    """The event that ends a run's stream with this outcome."""
    if ends_normally(status):
        return End(conversation=conversation_id, run=run_id, status=str(status))
    return ChatError(conversation=conversation_id, run=run_id, status=str(status), code=code, message=message)


def event_type(event: Terminal | Approval) -> EventType:
    if isinstance(event, End):
        return EventType.END
    if isinstance(event, ChatError):
        return EventType.CHAT_ERROR
    return EventType.APPROVAL


def body(event: Terminal | Approval) -> dict[str, Any]:
    """The event's data, as a JSON object."""
    return msgspec.structs.asdict(event)


# --- stream entries ------------------------------------------------------------------------------

#: The largest sequence part of a stream id: ``n-<this>`` is at or after every entry that starts at n.
ENTRY_SEQ_MAX = 2**64 - 1


def entry_id(first: int, count: int = 1) -> str:
    """The stream id of the entry holding events ``first``..``first + count - 1``."""
    return f"{first}-{count - 1}"


def entry_span(raw: Any) -> tuple[int, int]:
    """The first and last event id of the entry with stream id ``raw`` (bytes or str)."""
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    first, _, seq = text.partition("-")
    return int(first), int(first) + int(seq or 0)


def entry_fields(type_: EventType, data: list[bytes]) -> dict[str, str | bytes]:
    """The fields of the entry holding one event, or several ``token`` events (their JSON each)."""
    if len(data) == 1:
        return {"type": type_.value, "data": data[0]}
    if type_ is not EventType.TOKEN:
        raise ValueError(f"only token events share an entry, not {type_.value}")
    return {"type": type_.value, "data": b"[" + b",".join(data) + b"]"}


def entry_events(raw_id: Any, fields: dict[str, str]) -> list[tuple[int, str, str]]:
    """The events of one entry as ``(id, type, data JSON)``, in order."""
    first, last = entry_span(raw_id)
    type_ = fields.get("type", "")
    data = fields.get("data", "null")
    if last == first:
        return [(first, type_, data)]
    texts = loads(data)
    return [(first + i, type_, dumps(text).decode()) for i, text in enumerate(texts)]
