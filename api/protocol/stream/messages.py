"""Messages as the Agent Server streams them: LangChain's message dicts, built from native events.

Pure: one home for the shapes :mod:`api.protocol.stream.translate` and :mod:`api.protocol.stream.modes` send.
"""

from __future__ import annotations

from typing import Any


def ai_chunk(text: str, message_id: str) -> dict[str, Any]:
    """One token of an answer, as an ``AIMessageChunk``."""
    return {
        "content": text, "additional_kwargs": {}, "response_metadata": {}, "type": "AIMessageChunk",
        "name": None, "id": message_id, "tool_calls": [], "invalid_tool_calls": [],
        "usage_metadata": None, "tool_call_chunks": [],
    }


def ai_message(text: str, message_id: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
    """An answer so far (or whole), as an ``ai`` message with the tool calls it asks for."""
    message = {**ai_chunk(text, message_id), "type": "ai", "tool_calls": list(calls)}
    del message["tool_call_chunks"]
    return message


def tool_message(body: dict[str, Any], run_id: str) -> dict[str, Any]:
    """A tool's result (a native ``trace`` ``result``'s data), as a ``tool`` message."""
    return {
        "content": body.get("result", ""), "additional_kwargs": {}, "response_metadata": {},
        "type": "tool", "name": body.get("name"), "tool_call_id": body.get("tool_call_id"),
        "id": body.get("id") or f"run-{run_id}-{body.get('tool_call_id')}", "artifact": None,
        "status": "error" if body.get("status") == "error" else "success",
    }
