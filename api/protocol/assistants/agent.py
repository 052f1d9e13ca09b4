"""What Studio asks of an assistant: the agent's graph and its schemas.

The graph is the agent's shape as the API knows it (shared.storage.threads.state ``reader_graph``:
the worker's nodes and edges, without their work), drawn by LangGraph. The schemas say what the
protocol takes and gives, written out: a run's input is one new user message
(api/protocol/runs/input.py ``message_of``), the state is the thread's messages. LangGraph cannot
derive them here (pydantic refuses ``typing.TypedDict`` before Python 3.12), and a derived input
schema would claim more than a run takes.
"""

from __future__ import annotations

import functools
from typing import Any

from api.protocol.stream.translate import GRAPH_ID
from shared.contracts.assistants import NAME_MAX_CHARS, OVERRIDABLE, SYSTEM_PROMPT_MAX_CHARS

_MESSAGES_STATE: dict[str, Any] = {
    "title": "AgentState",
    "type": "object",
    "properties": {
        "messages": {
            "type": "array",
            "description": "The thread's messages (LangChain's: type human, ai or tool)",
            "items": {"type": "object"},
        },
    },
}

INPUT_SCHEMA: dict[str, Any] = {
    "title": "Input",
    "type": "object",
    "description": "One new user message; no input (or no messages) resumes the thread",
    "properties": {
        "messages": {
            "type": "array",
            "maxItems": 1,
            "items": {
                "type": "object",
                "properties": {
                    "role": {"enum": ["user", "human"]},
                    "content": {"type": ["string", "array"]},
                },
                "required": ["role", "content"],
            },
        },
    },
}


_TOOL_NAMES: dict[str, Any] = {
    "type": "array", "items": {"type": "string", "minLength": 1},
}
#: what an assistant's context (and a run's, for what the assistant marks configurable) may say:
#: shared/contracts/assistants.py checks it
CONTEXT_SCHEMA: dict[str, Any] = {
    "title": "Context",
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "system_prompt": {"type": "string", "maxLength": SYSTEM_PROMPT_MAX_CHARS,
                          "description": "The system prompt, instead of config/system.md"},
        "model": {"type": "string", "minLength": 1, "maxLength": NAME_MAX_CHARS,
                  "description": "The Ollama model, instead of OLLAMA_MODEL"},
        "tools": {**_TOOL_NAMES, "description": "The tools it may use: `server` or `server__tool`"},
        "require_approval": {
            **_TOOL_NAMES, "description": "Tools that wait for a decision, besides mcp.json's",
        },
        "configurable": {"type": "array", "items": {"enum": list(OVERRIDABLE)},
                         "description": "What a run's context may override"},
    },
}


@functools.cache
def graph() -> dict[str, Any]:
    """The SDK's drawable graph: ``{nodes: [{id, type, data}], edges: [{source, target, conditional?}]}``."""
    # LangGraph is loaded here, by Studio's first request for the graph, not with the API.
    from langgraph.checkpoint.memory import InMemorySaver

    from shared.storage.threads.state import reader_graph

    drawn: dict[str, Any] = reader_graph(InMemorySaver()).get_graph().to_json()
    return drawn


def schemas() -> dict[str, Any]:
    """The SDK's ``GraphSchema``: the agent's context is an assistant's configuration of it."""
    return {
        "graph_id": GRAPH_ID, "input_schema": INPUT_SCHEMA, "output_schema": _MESSAGES_STATE,
        "state_schema": _MESSAGES_STATE, "config_schema": None, "context_schema": CONTEXT_SCHEMA,
    }
