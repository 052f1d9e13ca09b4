"""A conversation's thread: the state LangGraph keeps for it, and its graph's shape.

The worker runs the graph (worker/agent/graph.py); the API only reads threads through
LangGraph's state API (``get_state`` / ``get_state_history``), which needs the
same channels (to rebuild the messages from what each checkpoint stored) and the
same nodes and edges (to tell which tasks are due). Both come from here.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypedDict

from langchain_core.messages import AnyMessage
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph

from shared.compat import messages_delta_reducer
from shared.contracts.runs import AGENT, APPROVAL, TOOLS
from shared.storage.threads.stand_ins import as_langgraph

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import DeltaChannelHistory

#: A full copy of the message list every this many updates of it (LangGraph's
#: default, written out so that a change is deliberate; ``MESSAGES_SNAPSHOT_EVERY``): between
#: two copies a checkpoint stores only what its step added, and a read replays the writes since
#: the last copy. Never prune checkpoints back past the last copy (shared/storage/threads/pruning.py).
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


def messages_channel(snapshot_frequency: int) -> Any:
    """The messages' channel of :class:`AgentState`, copied in full every ``snapshot_frequency``
    updates (``MESSAGES_SNAPSHOT_EVERY``). Only the writer cares (the worker's graph sets it in
    place of AgentState's own): a read takes the copies wherever they are."""
    reducer: Any = messages_delta_reducer()
    return DeltaChannel(reducer, snapshot_frequency=snapshot_frequency)


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


def langgraph_tuple(saved: CheckpointTuple) -> CheckpointTuple:
    """``saved`` as LangGraph's graph reads it: the stand-ins a reader process decodes Sends and
    Interrupts as (shared/storage/threads/stand_ins.py) turned back into LangGraph's own types."""
    return CheckpointTuple(
        saved.config, as_langgraph(saved.checkpoint), saved.metadata, saved.parent_config,
        as_langgraph(saved.pending_writes),
    )


class _LangGraphTypes(BaseCheckpointSaver[Any]):
    """A read-only view of ``saver`` whose checkpoints hold LangGraph's own types
    (:func:`langgraph_tuple`)."""

    def __init__(self, saver: BaseCheckpointSaver[Any]) -> None:
        super().__init__(serde=saver.serde)
        self.saver = saver

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        saved = self.saver.get_tuple(config)
        return None if saved is None else langgraph_tuple(saved)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        for saved in self.saver.list(config, filter=filter, before=before, limit=limit):
            yield langgraph_tuple(saved)

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        found: Mapping[str, DeltaChannelHistory] = as_langgraph(
            dict(self.saver.get_delta_channel_history(config=config, channels=channels))
        )
        return found

    def get_next_version(self, current: Any, channel: None) -> Any:
        return self.saver.get_next_version(current, channel)


def with_langgraph_types(saver: BaseCheckpointSaver[Any]) -> BaseCheckpointSaver[Any]:
    """``saver`` for LangGraph's own graph to read (:func:`langgraph_tuple`)."""
    return _LangGraphTypes(saver)
