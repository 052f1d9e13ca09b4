"""A conversation driven through the REST API, a turn at a time (tests/test_branches.py,
tests/test_pruning.py): post to a route, say something and wait for the answer, read the detail
and what it says."""

from __future__ import annotations

from typing import Any

import httpx

from tests.support.client import chat, get_json, read_sse


def post(url: str, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=30, trust_env=False)


def finish(url: str, conversation: str) -> str:
    """Wait for the conversation's current run to end; its status."""
    events = read_sse(url, conversation)
    assert events[-1].event == "end", events
    return str(events[-1].data["status"])


def say(url: str, text: str, conversation: str | None = None) -> str:
    """``text`` sent (to a new conversation without ``conversation``), its run completed."""
    conversation, _ = chat(url, text, conversation)
    assert finish(url, conversation) == "completed"
    return conversation


def detail(url: str, conversation: str) -> dict[str, Any]:
    return get_json(url, f"/api/conversations/{conversation}")


def said(body: dict[str, Any], *, tools: bool = True) -> list[tuple[str, str]]:
    """A detail's messages as (role, content); without ``tools``, the tools' answers left out."""
    return [(m["role"], m["content"]) for m in body["messages"] if tools or m["role"] != "tool"]
