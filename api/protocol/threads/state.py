"""A thread's state in the SDK's ``ThreadState`` shape, read in a reader process.

:func:`thread_state` is what ``Store.read_thread`` runs (api/store.py: LangGraph's
``get_state`` on the reader graph, off the event loop); it returns plain JSON-ready data.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from api.protocol.runs.interrupts import hitl_value
from shared.contracts.protocol import plain as _plain
from shared.contracts.protocol import values_of as values_of
from shared.storage.threads.branch import thread_at

# Imported by the functions, which run in a reader process: the API's main process, which only
# names them, never loads LangGraph (api/store.py).
if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

    from shared.storage.threads.snapshot import ThreadStates
    from shared.storage.threads.stand_ins import Snapshot as StateSnapshot


def _checkpoint(thread_id: str, config: RunnableConfig | None) -> dict[str, Any] | None:
    if config is None:
        return None
    configurable = config.get("configurable") or {}
    return {
        "thread_id": thread_id, "checkpoint_ns": configurable.get("checkpoint_ns", ""),
        "checkpoint_id": configurable.get("checkpoint_id"), "checkpoint_map": None,
    }


def _interrupt(interrupt: Any) -> dict[str, Any]:
    return {"value": hitl_value(_plain(interrupt.value)), "id": interrupt.id}


def state_of(thread_id: str, state: StateSnapshot) -> dict[str, Any]:
    interrupts = [_interrupt(i) for task in state.tasks for i in task.interrupts]
    return {
        "values": values_of(state),
        "next": list(state.next),
        "tasks": [
            {
                "id": task.id, "name": task.name, "error": task.error,
                "interrupts": [_interrupt(i) for i in task.interrupts],
                "checkpoint": None, "state": None, "result": None,
            }
            for task in state.tasks
        ],
        "checkpoint": _checkpoint(thread_id, state.config),
        "metadata": _plain(dict(state.metadata or {})),
        "created_at": state.created_at,
        "parent_checkpoint": _checkpoint(thread_id, state.parent_config),
        "interrupts": interrupts,
    }


def values_with_interrupts(state: dict[str, Any]) -> dict[str, Any]:
    """A state's values, with its pending interrupts as ``__interrupt__`` (as the Agent Server's
    last ``values`` of a paused run and its ``runs.wait`` answer carry them)."""
    values: dict[str, Any] = state["values"]
    return {**values, "__interrupt__": state["interrupts"]} if state["interrupts"] else values


def empty_state(thread_id: str) -> dict[str, Any]:
    """The state of a thread with nothing in it yet (created empty, or no checkpoint yet)."""
    return {
        "values": {}, "next": [], "tasks": [],
        "checkpoint": {
            "thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": None, "checkpoint_map": None,
        },
        "metadata": {}, "created_at": None, "parent_checkpoint": None, "interrupts": [],
    }


def thread_history(
    limit: int, before: str | None, metadata: dict[str, Any] | None,
    graph: ThreadStates, config: RunnableConfig,
) -> list[dict[str, Any]]:
    """In a reader process (a partial of this, with the request's options): the thread's
    checkpoints, newest first, each as a ``ThreadState``: every branch's (api/protocol/runs/forks.py),
    also when the read's config names the head of the branch the conversation follows."""
    thread_id = str(config["configurable"]["thread_id"])
    before_config = thread_at(thread_id, before) if before is not None else None
    history = graph.get_state_history(
        thread_at(thread_id), filter=metadata or None, before=before_config, limit=limit
    )
    return [state_of(thread_id, state) for state in history]


def thread_state_at(
    checkpoint_id: str, graph: ThreadStates, config: RunnableConfig
) -> dict[str, Any] | None:
    """In a reader process (a partial of this): the thread's state at one of its checkpoints;
    None when the thread has no such checkpoint."""
    thread_id = str(config["configurable"]["thread_id"])
    state = graph.get_state(thread_at(thread_id, checkpoint_id))
    if state.created_at is None:
        return None
    return state_of(thread_id, state)


def thread_state(graph: ThreadStates, config: RunnableConfig) -> dict[str, Any]:
    """In a reader process: the thread's state now."""
    thread_id = str(config["configurable"]["thread_id"])
    state = graph.get_state(config)
    if not state.values and not state.tasks and state.created_at is None:
        return empty_state(thread_id)
    return state_of(thread_id, state)


def pending_of(
    graph: ThreadStates, config: RunnableConfig
) -> list[tuple[str, list[dict[str, Any]]]]:
    """In a reader process: the thread's pending interrupts that ask for decisions, with their
    requests (``shared.storage.threads.state.pending_interrupts``), to map ``command.resume`` onto."""
    from shared.storage.threads.interrupts import pending_interrupts

    return pending_interrupts(graph.get_state(config))
