"""What the thread routes take: their bodies (the fields the SDK sends) and the checks of their
values (a thread's id, a checkpoint id, a ``ttl``), each naming what it refuses."""

from __future__ import annotations

import re
from typing import Any

import msgspec

from api.http.ids import parse_id
from shared.errors import BadRequest


class ThreadCreate(msgspec.Struct):
    """Body of ``POST /threads`` (the fields the SDK sends; the others are refused when set)."""

    thread_id: str | None = None
    metadata: dict[str, Any] | None = None
    if_exists: str | None = None
    supersteps: list[Any] | None = None
    ttl: Any = None


class ThreadSearch(msgspec.Struct):
    """Body of ``POST /threads/search``."""

    metadata: dict[str, Any] | None = None
    values: dict[str, Any] | None = None
    ids: list[str] | None = None
    status: str | None = None
    limit: int = 10
    offset: int = 0
    sort_by: str | None = None
    sort_order: str | None = None
    select: list[str] | None = None
    extract: dict[str, str] | None = None


class ThreadUpdate(msgspec.Struct):
    """Body of ``PATCH /threads/{id}``: metadata merged into the thread's, and a new ``ttl``."""

    metadata: dict[str, Any] | None = None
    ttl: Any = None


class StateAt(msgspec.Struct):
    """Body of ``POST /threads/{id}/state/checkpoint``."""

    checkpoint: dict[str, Any]
    subgraphs: bool | None = None
    select: list[str] | None = None


class ThreadHistory(msgspec.Struct):
    """Body of ``POST /threads/{id}/history``."""

    limit: int = 10
    before: str | dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    checkpoint: dict[str, Any] | None = None
    select: list[str] | None = None


HISTORY_LIMIT_MAX = 1000
CHECKPOINT_ID = re.compile(r"[0-9A-Za-z-]{1,64}")
#: the metadata keys a history can filter on: what LangGraph's savers take in a filter
FILTER_KEY = re.compile(r"[0-9A-Za-z_.-]{1,128}")


def before_of(value: str | dict[str, Any] | None) -> str | None:
    """The checkpoint id of ``before`` (an id, or a ``Checkpoint`` with one), checked."""
    if isinstance(value, dict):
        value = value.get("checkpoint_id")
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not CHECKPOINT_ID.fullmatch(value):
        raise BadRequest("a checkpoint id is letters, digits and '-' (before: an id or a checkpoint)")
    return value


#: the longest ``ttl`` taken: ten years, in minutes (a number Redis scores hold exactly)
TTL_MAX_MINUTES = 10 * 366 * 24 * 60.0


def ttl_of(value: Any) -> float | None:
    """A thread's ``ttl`` as the SDK sends it (``{"ttl": minutes, "strategy": "delete"}``, or the
    minutes alone): the minutes, checked; None when left out."""
    if value is None:
        return None
    if isinstance(value, dict):
        strategy = value.get("strategy", "delete")
        if strategy != "delete":
            raise BadRequest(
                f"ttl strategy {str(strategy)[:32]!r} is not served by Sophos: 'delete' only "
                "(docs/agent-protocol.md)"
            )
        extra = sorted(set(value) - {"ttl", "strategy"})
        if extra:
            raise BadRequest(f"ttl takes ttl (minutes) and strategy, not {extra[0][:32]!r}")
        value = value.get("ttl")
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= TTL_MAX_MINUTES:
        raise BadRequest(f"ttl is a number of minutes, more than 0 and at most {TTL_MAX_MINUTES:.0f}")
    return float(value)


def thread_id_of(value: str) -> str:
    return parse_id(value, "thread_id")
