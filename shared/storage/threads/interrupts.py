"""A thread's pending interrupts, read from its state, and the resume that answers them.

Plain functions of LangGraph's ``StateSnapshot`` (as ``get_state`` gives it: the worker's graph,
or shared/storage/threads/snapshot.py in the API's reader processes), in a module that imports no part
of LangGraph: a reader process imports this, and must not load the graph runtime
(shared/storage/threads/state.py does, to define the thread's channels).
"""

from __future__ import annotations

from typing import Any


def pending_interrupts(state: Any) -> list[tuple[str, list[dict[str, Any]]]]:
    """Each pending interrupt that asks for decisions: its id and its requests, in the order of
    the state's tasks (the Agent Protocol lists them, and takes decisions, in this order)."""
    found = []
    for task in state.tasks:
        for interrupt in task.interrupts:
            value = interrupt.value
            if isinstance(value, dict) and "requests" in value:
                found.append((interrupt.id, [{"kind": "approval", **r} for r in value["requests"]]))
    return found


def interrupt_requests(state: Any) -> list[dict[str, Any]] | None:
    """The requests of a thread's pending interrupts, or None when none is pending.

    Two kinds ask for decisions (``kind`` in each request): the approval step's one interrupt
    per turn, listing the calls configured to need approval (``approval``), and one interrupt
    per call that may already have run, raised by its own task on resume (``uncertain``,
    worker/tools/ledger/). ``state`` is LangGraph's ``StateSnapshot`` of the thread: the worker's
    ending, its approval deadlines and the API's decision checks all read them through here.
    """
    pending = pending_interrupts(state)
    return [r for _, requests in pending for r in requests] if pending else None


def resume_value(state: Any, decisions: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The ``Command(resume=...)`` for ``decisions``: each pending interrupt's id to the decisions
    about its own requests (LangGraph needs one value per interrupt when several are pending)."""
    by_call = {str(d["id"]): d for d in decisions}
    return {
        interrupt_id: [by_call[str(r["id"])] for r in requests if str(r["id"]) in by_call]
        for interrupt_id, requests in pending_interrupts(state)
    }
