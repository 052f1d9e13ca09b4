"""The floor: the worker's own graph, model and tool, run in-process with nothing around them.

Same ``worker.agent.graph.build_graph``, same ``ChatOllama`` (``worker.agent.model.build_model``)
against the same fake model server, same MCP tools server through
``worker.tools.mcp.McpToolbox``, a connection opened like the worker's
(``worker.store.connect``: WAL, ``synchronous=FULL``), same
``graph.astream(..., stream_mode=["messages", "tasks"], durability="sync")``.
What it leaves out is the service: HTTP, the queue, the run rows, the events,
the SSE relay and the ledger. Its saver is LangGraph's own ``AsyncSqliteSaver``, so the
floor is LangGraph as shipped; the worker's ``OneHopSaver``
(shared/storage/sqlite_saver.py) is the service's own, and figure 18 compares the two
side by side. It writes to a database file of its own.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any, cast

# As the worker does, before LangGraph is imported.
os.environ.setdefault("LANGGRAPH_STRICT_MSGPACK", "true")

from langchain_core.messages import AIMessageChunk, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph.state import CompiledStateGraph

from shared.settings import Settings
from worker.agent.graph import AGENT, build_graph, read_system_prompt
from worker.agent.model import build_model
from worker.store import connect
from worker.tools.mcp import McpToolbox, load_config


@dataclass(frozen=True, slots=True)
class FloorRun:
    total_ms: float
    first_token_ms: float
    tokens: int
    tool_results: int


class Floor:
    def __init__(self, graph: CompiledStateGraph[Any, Any, Any, Any], settings: Settings) -> None:
        self.graph = graph
        self.settings = settings

    async def run(self, thread_id: str, message: str) -> FloorRun:
        config: RunnableConfig = {
            "configurable": {"thread_id": thread_id},
            "metadata": {"run_id": str(uuid.uuid4())},
            "recursion_limit": self.settings.agent_recursion_limit,
        }
        graph_input = {"messages": [HumanMessage(message, id=str(uuid.uuid4()))]}
        started = time.perf_counter()
        first_token = 0.0
        tokens = tool_results = 0
        async for item in self.graph.astream(
            graph_input, config, stream_mode=["messages", "tasks"], durability="sync"
        ):
            mode, payload = cast(tuple[str, Any], item)
            if mode == "messages":
                chunk, meta = payload
                if (
                    meta.get("langgraph_node") == AGENT
                    and isinstance(chunk, AIMessageChunk)
                    and chunk.content
                ):
                    tokens += 1
                    if not first_token:
                        first_token = time.perf_counter()
            elif mode == "tasks" and payload.get("name") == "tools" and "result" in payload:
                tool_results += 1
        total = time.perf_counter() - started
        return FloorRun(
            total * 1000,
            (first_token - started) * 1000 if first_token else float("nan"),
            tokens,
            tool_results,
        )


@asynccontextmanager
async def in_process_floor(settings: Settings, env: Mapping[str, str]) -> AsyncIterator[Floor]:
    """Open the floor's database, MCP session and graph (``settings.database_path`` is its own file)."""
    async with AsyncExitStack() as stack:
        conn = await connect(settings.database_path)
        stack.push_async_callback(conn.close)
        saver = AsyncSqliteSaver(conn)
        await saver.setup()
        toolbox = McpToolbox.from_config(
            load_config(settings.mcp_config_path, env),
            start_timeout=settings.mcp_start_timeout,
            call_timeout=settings.mcp_call_timeout,
        )
        stack.push_async_callback(toolbox.close)
        await toolbox.open()
        if not toolbox.tools:
            raise RuntimeError(f"the floor's MCP tools server did not start: {toolbox.status()}")
        graph = build_graph(
            model=build_model(settings),
            tools=toolbox.tools,
            system_prompt=read_system_prompt(settings.system_prompt_path),
            checkpointer=saver,
        )
        yield Floor(graph, settings)
