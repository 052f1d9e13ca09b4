"""Pending approvals: read from the thread's checkpoint, and decisions checked against them.

The pending approval is the interrupt of the ``approval`` node (worker/agent/graph.py), a
pending write on the thread's last checkpoint: ``state.tasks[i].interrupts``. The
API reads it through its reader (api/store.py ``read_thread``), never the tables.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from msgspec import UNSET

from api.chat.schemas import DecisionBody
from api.conversations.schemas import PendingCall
from shared.contracts.codec import encode
from shared.contracts.jobs import Decision, DecisionAction
from shared.errors import BadRequest

if TYPE_CHECKING:  # read by a reader process; the API's main process never loads LangGraph
    from langchain_core.runnables import RunnableConfig

    from shared.storage.threads.snapshot import ThreadStates


def pending_requests(
    graph: ThreadStates, config: RunnableConfig
) -> list[dict[str, Any]] | None:
    """The tool calls waiting for a decision, or None when none wait (picklable: a reader runs it)."""
    from shared.storage.threads.interrupts import interrupt_requests

    return interrupt_requests(graph.get_state(config))


def pending_call(request: dict[str, Any]) -> PendingCall:
    """A pending request as the detail shows it (the ``approval`` event carries the same fields)."""
    attempts = request.get("attempts")
    return PendingCall(
        id=str(request["id"]), name=str(request["name"]), arguments=dict(request["arguments"]),
        kind=request.get("kind", "approval"), attempts=int(attempts) if attempts is not None else UNSET,
    )


def check_shape(decisions: list[DecisionBody]) -> None:
    """What can be told without the thread: repeated ids, an edit without arguments."""
    problems: list[str] = []
    repeated = sorted(i for i, n in Counter(d.id for d in decisions).items() if n > 1)
    if repeated:
        problems.append(f"repeated ids: {', '.join(repeated)}")
    no_arguments = [d.id for d in decisions if d.action == DecisionAction.EDIT and d.arguments is None]
    if no_arguments:
        problems.append(f"edit needs arguments: {', '.join(no_arguments)}")
    if not decisions:
        problems.append("decisions must not be empty")
    if problems:
        raise BadRequest("; ".join(problems))


def match(decisions: list[DecisionBody], requests: list[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    """Exactly one decision per pending request, as job payload; 400 naming what does not match."""
    pending = [str(r["id"]) for r in requests]
    given = {d.id for d in decisions}
    missing = [i for i in pending if i not in given]
    unknown = sorted(given - set(pending))
    problems = []
    if missing:
        problems.append(f"no decision for: {', '.join(missing)}")
    if unknown:
        problems.append(f"unknown ids: {', '.join(unknown)}")
    if problems:
        raise BadRequest("; ".join(problems))
    return tuple(
        encode(Decision(d.id, DecisionAction(d.action), d.arguments, d.message)) for d in decisions
    )
