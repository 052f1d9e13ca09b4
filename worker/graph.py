"""The agent graph: START → agent ⇄ tools → END."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import SystemMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from shared.metrics import MODEL_CALL
from shared.thread import AGENT, TOOLS, AgentState
from worker.metrics import timed

__all__ = ["AGENT", "TOOLS", "build_graph", "read_system_prompt"]


def build_graph(
    *,
    model: BaseChatModel,
    tools: list[BaseTool],
    system_prompt: Callable[[], str],
    checkpointer: BaseCheckpointSaver[Any],
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """Compile the agent graph.

    ``system_prompt`` is called on every model call (edits to ``system.md``
    apply to the next call) and its text is prepended to the messages sent to
    the model, never written to the thread.
    """
    bound = model.bind_tools(tools) if tools else model

    async def agent(state: AgentState, config: RunnableConfig) -> dict[str, Any]:
        prompt = system_prompt()
        messages = [SystemMessage(prompt), *state["messages"]] if prompt else list(state["messages"])
        with timed(MODEL_CALL):
            response = await bound.ainvoke(messages, config)
        return {"messages": [response]}

    # Messages stored once per thread (DeltaChannel): see shared/thread.py.
    graph = StateGraph(AgentState)
    graph.add_node(AGENT, agent)
    # Errors of a tool go back to the model as a ToolMessage with status "error".
    graph.add_node(TOOLS, ToolNode(tools, handle_tool_errors=True))
    graph.add_edge(START, AGENT)
    graph.add_conditional_edges(AGENT, tools_condition, {"tools": TOOLS, END: END})
    graph.add_edge(TOOLS, AGENT)
    return graph.compile(checkpointer=checkpointer)


def read_system_prompt(path: Any) -> Callable[[], str]:
    """The prompt file's text, read again only when its size or mtime changed.

    Called on every model call, so an edit applies to the next one; a ``stat`` is
    cheaper than opening and reading the file each time.
    """
    seen: tuple[int, int] | None = None
    text = ""

    def read() -> str:
        nonlocal seen, text
        try:
            st = path.stat()
            if (st.st_mtime_ns, st.st_size) != seen:
                text = str(path.read_text()).strip()
                seen = (st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            seen, text = None, ""
        return text

    return read
