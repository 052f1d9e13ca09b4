"""What a fork or a rollback reads of the thread (api/protocol/runs/forks.py), in a reader process.

Module-level functions with picklable results, which ``Store.read_thread`` runs in a reader
process (api/thread_read.py); in a module of their own so that a reader imports only these and
not the API's services that forks.py needs (bench figure 16).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from api.chat.branches import thread_at

# LangGraph is imported by the functions, which run in a reader process: the API's main process,
# which only names them, need not load it (api/store.py).
if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

    from shared.storage.threads.snapshot import ThreadStates

    Graph = ThreadStates


@dataclass(frozen=True, slots=True)
class At:
    """What a fork needs to know of its checkpoint."""

    pending: bool
    waiting: bool


def checkpoint_at(checkpoint_id: str, graph: Graph, config: RunnableConfig) -> At | None:
    """The checkpoint's pending tasks and interrupts; None when the thread has no such checkpoint."""
    state = graph.get_state(thread_at(config, checkpoint_id))
    if state.created_at is None:
        return None
    return At(pending=bool(state.tasks), waiting=any(task.interrupts for task in state.tasks))


@dataclass(frozen=True, slots=True)
class Started:
    """Where a run started on its thread."""

    #: the run's first checkpoint
    first: str
    #: its parent: the checkpoint the run started from (None: the run was the thread's first)
    parent: str | None
    #: the first checkpoint received the run's message (an input checkpoint)
    received: bool


def run_started(run_id: str, graph: Graph, config: RunnableConfig) -> Started | None:
    """Where ``run_id`` started (its checkpoints carry its id: DESIGN.md); None if it wrote none."""
    from langgraph.checkpoint.base import BaseCheckpointSaver

    saver = graph.checkpointer
    if not isinstance(saver, BaseCheckpointSaver):
        raise TypeError("the reader's graph has no checkpointer")
    written = list(saver.list(thread_at(config), filter={"run_id": run_id}))
    if not written:
        return None
    # ids sort by time
    first = min(written, key=lambda item: str(item.config["configurable"]["checkpoint_id"]))
    parent = first.parent_config["configurable"].get("checkpoint_id") if first.parent_config else None
    return Started(
        first=str(first.config["configurable"]["checkpoint_id"]),
        parent=str(parent) if parent else None,
        received=(first.metadata or {}).get("source") == "input",
    )
