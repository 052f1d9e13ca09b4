"""A conversation's thread: the state LangGraph keeps for it, and its graph's shape.

The worker runs the graph (worker/agent/graph.py); the API only reads threads through
LangGraph's state API (``get_state`` / ``get_state_history``), which needs the
same channels (to rebuild the messages from what each checkpoint stored) and the
same nodes and edges (to tell which tasks are due). Both come from here.
"""

from __future__ import annotations

from typing import Annotated, Any, NoReturn, TypedDict

from langchain_core.messages import AnyMessage
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph

from shared.compat import messages_delta_reducer
from shared.contracts.runs import AGENT, APPROVAL, TOOLS

#: A full copy of the message list every this many updates of it (LangGraph's
#: default, written out so that a change is deliberate): between two copies a
#: checkpoint stores only what its step added, and a read replays the writes since
#: the last copy. Never prune checkpoints back past the last copy.
SNAPSHOT_FREQUENCY = 100


class AgentState(TypedDict):
    """The thread's state: its messages, each stored once.

    With the plain ``add_messages`` channel (``MessagesState``, before) every
    checkpoint held the whole list, so a thread grew quadratically. A thread
    written that way still opens: DeltaChannel takes the full list stored in its
    last checkpoint as its starting value (tests/test_storage.py, fixture database).
    """

    messages: Annotated[
        # LangGraph's private, "experimental" batch reducer (shared/compat.py): langgraph is
        # pinned exactly for it (pyproject.toml)
        list[AnyMessage], DeltaChannel(messages_delta_reducer(), snapshot_frequency=SNAPSHOT_FREQUENCY)
    ]


def _never(state: AgentState) -> NoReturn:
    raise RuntimeError("the reader's graph never runs a node")


def reader_graph(checkpointer: BaseCheckpointSaver[Any]) -> CompiledStateGraph[Any, Any, Any, Any]:
    """The agent graph's shape (START → agent ⇄ [approval →] tools → END) without its work, for reading.

    tests/test_storage.py checks that it has the worker's nodes and edges.
    """
    graph = StateGraph(AgentState)
    graph.add_node(AGENT, _never)
    graph.add_node(APPROVAL, _never, destinations=(TOOLS, AGENT))
    graph.add_node(TOOLS, _never)
    graph.add_edge(START, AGENT)
    graph.add_conditional_edges(AGENT, _never, {TOOLS: TOOLS, APPROVAL: APPROVAL, END: END})
    graph.add_edge(TOOLS, AGENT)
    return graph.compile(checkpointer=checkpointer)


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
    worker/tools/ledger.py). ``state`` is LangGraph's ``StateSnapshot`` of the thread: the worker's
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
