"""The agent graph reads its tools on every model call and tools step (worker/agent/graph.py).

A tool server that comes up after the worker started must be offered to the model and
found by the tools node, without building the graph again: here the tools are a
function whose answer changes between two turns, on the real graph with an in-memory
saver and a fake model that records what each call was bound to.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from langchain_core.language_models import LanguageModelInput
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool, tool
from langgraph.checkpoint.memory import InMemorySaver

from worker.agent.graph import build_graph

#: The tool names each model call was offered, in order.
OFFERED: list[list[str]] = []


class Recording(GenericFakeChatModel):
    def bind_tools(
        self, tools: Sequence[Any], *, tool_choice: str | None = None, **kwargs: Any
    ) -> Runnable[LanguageModelInput, AIMessage]:
        return self.bind(tools=[t.name for t in tools])

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        OFFERED.append(list(kwargs.get("tools", [])))
        return super()._generate(messages, stop, run_manager, **kwargs)


@tool
def late__echo(text: str) -> str:
    """Return the text unchanged."""
    return text


async def test_tools_that_appear_between_turns_are_offered_and_run() -> None:
    OFFERED.clear()
    replies = iter([
        AIMessage("nothing to call yet"),
        AIMessage("", tool_calls=[{"name": "late__echo", "args": {"text": "back"}, "id": "call-1"}]),
        AIMessage("it answered"),
    ])
    tools: tuple[BaseTool, ...] = ()
    graph = build_graph(
        model=Recording(messages=replies), tools=lambda: tools, system_prompt=lambda: "",
        checkpointer=InMemorySaver(),
    )
    config: Any = {"configurable": {"thread_id": str(uuid.uuid4())}}
    await graph.ainvoke({"messages": [HumanMessage("which tools?")]}, config)
    tools = (late__echo,)  # the server came up
    state = await graph.ainvoke({"messages": [HumanMessage("and now?")]}, config)

    assert OFFERED == [[], ["late__echo"], ["late__echo"]]
    results = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    assert [(r.name, r.status, r.content) for r in results] == [("late__echo", "success", "back")]
