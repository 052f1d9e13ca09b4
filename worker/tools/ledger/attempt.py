"""The request of a tool call being made now (worker/tools/ledger/__init__.py): its ``_meta``, and
what the tool's transport tells the ledger while it is made.

:meth:`~worker.tools.ledger.calls.Ledger.run` makes each request inside :func:`sending`; the
transport (worker/tools/mcp.py) reads :func:`request_meta` for the request, and says through
:func:`unanswered` that its answer did not come, and through :func:`task_state` which MCP task the
request is (worker/tools/tasks.py). A context variable carries it, so the transport needs no
handle on the ledger, and a request made outside a ledger (tests of a session alone) carries none.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

#: the key of a ``tools/call`` request's ``_meta`` that carries the call's idempotency key
IDEMPOTENCY_META_KEY = "sophos/idempotency-key"

#: commits a task's id and state beside the call's intent
OnTask = Callable[[str, str], Awaitable[None]]


@dataclass(slots=True)
class Attempt:
    """The request being made in this context (set by :func:`sending`): its ``_meta``, and why its
    answer did not come, once the tool's transport says so (:func:`unanswered`)."""

    meta: dict[str, Any]
    unanswered: str | None = None
    #: commits a task's id and state beside the call's intent (:func:`task_state`)
    on_task: OnTask | None = None


_ATTEMPT: ContextVar[Attempt | None] = ContextVar("sophos_tool_attempt", default=None)


def request_meta() -> dict[str, Any] | None:
    """The ``_meta`` for a ``tools/call`` request made now: the call's idempotency key, if any."""
    attempt = _ATTEMPT.get()
    return attempt.meta if attempt is not None else None


def unanswered(why: str) -> None:
    """Say that the request made now was sent and its answer did not come: it timed out, or the
    transport was lost (worker/tools/mcp.py). The call may have acted: the ledger treats it as a
    call cut by a crash (worker/tools/ledger/__init__.py), whatever error the model would otherwise
    be given."""
    attempt = _ATTEMPT.get()
    if attempt is not None:
        attempt.unanswered = why


async def task_state(task_id: str, state: str) -> None:
    """Say that the request made now is the MCP task ``task_id``, now in ``state``
    (worker/tools/tasks.py): committed beside the call's intent before the wait goes on."""
    attempt = _ATTEMPT.get()
    if attempt is not None and attempt.on_task is not None:
        await attempt.on_task(task_id, state)


@contextmanager
def sending(key: str, on_task: OnTask | None = None) -> Iterator[Attempt]:
    """The context a request of the call keyed ``key`` is made in (see :func:`request_meta`)."""
    attempt = Attempt({IDEMPOTENCY_META_KEY: key}, on_task=on_task)
    token = _ATTEMPT.set(attempt)
    try:
        yield attempt
    finally:
        _ATTEMPT.reset(token)
