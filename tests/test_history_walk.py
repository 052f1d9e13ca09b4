"""A thread's history read newest first from each child's rebuilt messages
(shared/storage/threads/history.py).

Real savers on both engines (a SQLite file; the machine's PostgreSQL), no process: a thread of a
graph with the agent's state (messages a ``DeltaChannel``, here a snapshot every 8 updates) long
enough to cross a few, with tool calls, a message replaced under its id, and a fork. Read
through :func:`shared.storage.threads.history.states` a few checkpoints a page, every state is the one
LangGraph's own ``get_state_history`` gives, and the JSON Lines export's lines are the same.
"""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import msgspec
import pytest
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph

from api.chat import branches
from api.conversations.transcript import lines_of
from shared.compat import messages_delta_reducer
from shared.storage.threads.branch import thread_at
from shared.storage.threads.history import HistoryWalk, states

THREAD = "thread-1"
#: the agent's state (shared/storage/threads/state.py), its snapshots every 8 updates of the messages
SNAPSHOT_FREQUENCY = 8
TURNS = 16  # 2 to 4 updates of the messages a turn: past 5 snapshots


class AgentState(TypedDict):
    messages: Annotated[
        list[AnyMessage], DeltaChannel(messages_delta_reducer(), snapshot_frequency=SNAPSHOT_FREQUENCY)
    ]


def agent(state: AgentState) -> dict[str, Any]:
    last = state["messages"][-1]
    if isinstance(last, HumanMessage) and "tool" in str(last.content):
        call = {"id": f"call-{len(state['messages'])}", "name": "add", "args": {"a": 1, "b": 2}}
        return {"messages": [AIMessage(content="", tool_calls=[call])]}
    if isinstance(last, HumanMessage) and "replace" in str(last.content):
        earlier = next(m for m in reversed(state["messages"]) if isinstance(m, AIMessage))
        return {"messages": [AIMessage(id=earlier.id, content=f"{earlier.content} (edited)")]}
    return {"messages": [AIMessage(content=f"An answer to {last.content}.")]}


def tools(state: AgentState) -> dict[str, Any]:
    call = state["messages"][-1].tool_calls[0]  # type: ignore[attr-defined]
    return {"messages": [ToolMessage(content="3", tool_call_id=call["id"], name="add")]}


def route(state: AgentState) -> str:
    last = state["messages"][-1]
    return "tools" if isinstance(last, AIMessage) and last.tool_calls else END


def graph_on(saver: BaseCheckpointSaver[Any]) -> Any:
    graph = StateGraph(AgentState)
    graph.add_node("agent", agent)
    graph.add_node("tools", tools)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", route, {"tools": "tools", END: END})
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=saver)


def question(turn: int) -> str:
    return {3: "use a tool", 4: "replace it"}.get(turn % 5, "go on") + f" ({turn})"


@contextlib.contextmanager
def saver_for(
    engine: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[BaseCheckpointSaver[Any]]:
    if engine == "sqlite":
        from langgraph.checkpoint.sqlite import SqliteSaver

        conn = sqlite3.connect(tmp_path / "threads.db", check_same_thread=False)
        try:
            yield SqliteSaver(conn)
        finally:
            conn.close()
        return
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row

    url = request.getfixturevalue("postgres_url")
    with psycopg.connect(url, autocommit=True, prepare_threshold=0, row_factory=dict_row) as conn:
        saver = PostgresSaver(conn)
        saver.setup()
        yield saver


def comparable(state: Any) -> tuple[Any, ...]:
    return (
        state.config, state.parent_config, state.metadata, state.created_at, state.next, state.values,
        [(t.name, t.path, t.error, t.interrupts, t.result) for t in state.tasks],
    )


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_the_history_read_from_each_childs_messages_is_langgraphs(
    engine: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    with saver_for(engine, tmp_path, request) as saver:
        graph = graph_on(saver)
        config = thread_at(THREAD)
        for turn in range(TURNS):
            graph.invoke({"messages": [HumanMessage(content=question(turn))]}, config, durability="sync")
        whole = list(graph.get_state_history(config))
        assert len(whole) > 50

        # Every state as LangGraph gives it, read 5 checkpoints a page (pages end mid-interval),
        # with a walk of the ancestors only after a snapshot, or where a fork broke the path.
        walk = HistoryWalk(saver)
        reading = graph_on(walk)
        assert [comparable(s) for s in states(reading, config, page=5)] == [comparable(s) for s in whole]
        assert 0 < walk.walks <= len(whole) // SNAPSHOT_FREQUENCY + 2
        # The export's lines, as they were made from LangGraph's history.
        e = msgspec.json.encode
        assert e(branches.lines(False, graph, config)[0]) == e(lines_of(iter(whole)))

        # A fork from a checkpoint of turn 6 or so: both branches in one history, each state LangGraph's.
        fork_at = next(s for s in reversed(whole) if s.metadata and s.metadata.get("step") == 20)
        graph.invoke({"messages": [HumanMessage(content="another way")]}, fork_at.config, durability="sync")
        forked = list(graph.get_state_history(config))
        assert len(forked) > len(whole)
        assert [comparable(s) for s in states(graph, config, page=5)] == [comparable(s) for s in forked]


def test_the_apis_main_process_does_not_load_langgraph_for_it() -> None:
    """The walk imports LangGraph; the API imports it only where a reader process runs it."""
    loaded_by_app = "import sys, api.app; print(sorted(m for m in sys.modules if 'langgraph' in m))"
    loaded = subprocess.run(
        [sys.executable, "-c", loaded_by_app],
        capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[1],
    ).stdout.strip()
    assert loaded == "[]"
