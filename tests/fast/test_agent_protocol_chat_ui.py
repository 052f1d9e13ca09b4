"""What the Agent Protocol does for agent-chat-ui, its pure parts (docs/agent-protocol.md,
"agent-chat-ui, step by step"; the browser tier is tests/test_agent_chat_ui.py): the tool messages
it sends before a message over a pending approval, a cut run's head, the server's metadata."""

from __future__ import annotations

import json
from typing import Any

import pytest

from api.conversations.schemas import ConversationInfo
from api.protocol.runs.input import answers_of, message_of
from api.protocol.threads.found import CUT_HINT, Found, with_cut_noted
from api.protocol.threads.records import Record
from api.runs.schemas import RunError
from shared.contracts.protocol import ASSISTANT_ID
from shared.contracts.runs import RunStatus
from shared.errors import BadRequest

HUMAN = {"id": "h1", "type": "human", "content": [{"type": "text", "text": "never mind"}]}


def tool(call_id: Any, content: Any = "Successfully handled tool call.") -> dict[str, Any]:
    return {"type": "tool", "tool_call_id": call_id, "id": "do-not-render-1", "name": "tools__add",
            "content": content}


def info(status: RunStatus, error: RunError | None = None) -> ConversationInfo:
    extra = {"error": error} if error is not None else {}
    when = "2026-12-07T00:00:00Z"
    return ConversationInfo(
        id="c", title="t", created_at=when, updated_at=when, message_count=1, status=status,
        resumable=True, **extra,
    )


def test_tool_messages_before_a_new_message_are_answers_to_the_pending_calls() -> None:
    answers, rest = answers_of({"messages": [tool("a"), tool("b", [{"type": "text", "text": "no"}]), HUMAN]})
    assert answers == {"a": "Successfully handled tool call.", "b": "no"}
    assert rest == {"messages": [HUMAN]} and message_of(rest) == "never mind"
    # A plain message, or messages that are not tool messages first, are left as they are.
    assert answers_of({"messages": [HUMAN]}) == ({}, {"messages": [HUMAN]})
    assert answers_of({"messages": [HUMAN, HUMAN]})[0] == {}
    assert answers_of(None) == ({}, None)
    with pytest.raises(BadRequest, match="tool_call_id"):
        answers_of({"messages": [tool(None), HUMAN]})
    with pytest.raises(BadRequest, match="content"):
        answers_of({"messages": [tool("a", 5), HUMAN]})


def _state(**task: Any) -> dict[str, Any]:
    return {"values": {}, "tasks": [{"id": "t", "name": "agent", "error": None, "interrupts": [], **task}]}


def test_a_cut_runs_head_task_says_why_its_answer_is_gone() -> None:
    stopped = RunError(code="INTERRUPTED", message="the worker stopped during the run")
    cut = info(RunStatus.INTERRUPTED, stopped)
    noted = with_cut_noted(cut, _state())
    error = json.loads(noted["tasks"][-1]["error"])
    assert error == {"error": "INTERRUPTED", "message": "the worker stopped during the run." + CUT_HINT}
    # Nothing to say: no task left, a task waiting for a decision, another status, no error.
    assert with_cut_noted(cut, {"values": {}, "tasks": []}) == {"values": {}, "tasks": []}
    waiting = _state(interrupts=[{"id": "i", "value": {}}])
    assert with_cut_noted(cut, waiting) == waiting
    assert with_cut_noted(info(RunStatus.COMPLETED), _state()) == _state()
    assert with_cut_noted(info(RunStatus.INTERRUPTED), _state()) == _state()
    assert with_cut_noted(None, _state()) == _state()


def test_graph_and_assistant_are_the_servers_once_a_thread_has_run() -> None:
    record = Record("c", "2026-12-07T00:00:00Z", {"user": "ada", "graph_id": "mine"})
    assert Found("c", record, None).metadata == {"user": "ada", "graph_id": "mine", "owner": "local"}
    ran = Found("c", record, info(RunStatus.COMPLETED)).metadata
    assert ran == {"user": "ada", "graph_id": "agent", "assistant_id": ASSISTANT_ID, "owner": "local"}
