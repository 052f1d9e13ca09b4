"""/mcp's pure parts (api/protocol/mcp.py): tool names made to fit MCP's rule, a call's
arguments, and what a call answers for each way its run ended."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from mcp import types
from mcp.shared.tool_name_validation import validate_tool_name

from api.protocol.mcp import answer, arguments_of, tool_names
from shared.contracts.protocol import ASSISTANT_ID
from shared.contracts.runs import RunStatus
from shared.errors import BadRequest

# Fixed ids: they appear in the parametrized cases, whose ids xdist workers must collect alike.
THREAD, RUN = "5f0c6a2e-3b1d-4c8e-9a7f-2d4b6e8f0a1c", "8e2d4f6a-1c3b-4e5d-8f7a-9b0c1d2e3f4a"


def assistant(name: str, assistant_id: str | None = None) -> dict[str, Any]:
    return {"assistant_id": assistant_id or str(uuid.uuid4()), "name": name}


def test_tool_names_fit_mcps_rule_and_never_collide() -> None:
    mine = assistant("agent")
    twins = [assistant("Same name"), assistant("Same name")]
    named = tool_names([
        assistant("agent", ASSISTANT_ID), mine, *twins, assistant("Alice's helper!"), assistant("«»"),
        assistant("x" * 300),
    ])
    assert named["agent"]["assistant_id"] == ASSISTANT_ID  # the default keeps its name
    assert named[f"agent_{mine['assistant_id'][:8]}"] is mine
    assert {f"Same_name_{t['assistant_id'][:8]}" for t in twins} <= set(named)
    assert "Alice_s_helper" in named and "assistant" in named and "x" * 128 in named
    assert len(named) == 7
    assert all(validate_tool_name(name).is_valid for name in named)


def test_arguments_are_a_message_and_maybe_a_thread() -> None:
    assert arguments_of({"message": "hi"}) == ("hi", None)
    assert arguments_of({"thread_id": THREAD.upper()}) == (None, THREAD)  # a resume
    for bad, why in [
        ({}, "message is required"), ({"message": " "}, "message must be a non-empty string"),
        ({"message": 3}, "message must be a non-empty string"), ({"thread_id": 3}, "thread_id must be"),
        ({"message": "hi", "files": []}, "unknown arguments: files"), ({"thread_id": "nope"}, "thread_id"),
    ]:
        with pytest.raises(BadRequest, match=why):
            arguments_of(bad)


def said(*messages: dict[str, Any], asked: list[str] | None = None) -> dict[str, Any]:
    values: dict[str, Any] = {"messages": list(messages)}
    if asked:
        values["__interrupt__"] = [{"value": {"action_requests": [{"name": n} for n in asked]}}]
    return values


def text(result: types.CallToolResult) -> str:
    [block] = result.content
    assert isinstance(block, types.TextContent)
    return block.text


HUMAN = {"type": "human", "content": "hi"}
AI = {"type": "ai", "content": [{"type": "text", "text": "Hello."}], "tool_calls": []}
CALLING = {"type": "ai", "content": "", "tool_calls": [{"name": "tools__add"}]}


@pytest.mark.parametrize(("status", "error", "resumable", "values", "is_error", "says"), [
    (RunStatus.COMPLETED, None, False, said(HUMAN, AI), False, "Hello."),
    (RunStatus.COMPLETED, None, False, said(HUMAN), True, "ended without an answer"),
    (RunStatus.WAITING, None, False, said(HUMAN, CALLING, asked=["tools__add"]), False,
     f"waits for approval of tools__add on thread {THREAD}"),
    (RunStatus.WAITING, ("APPROVAL_PENDING", "the thread waits for a decision"), False, said(HUMAN), True,
     "APPROVAL_PENDING: the thread waits for a decision"),
    (RunStatus.FAILED, ("MODEL_ERROR", "the model broke"), False, said(HUMAN), True,
     "MODEL_ERROR: the model broke"),
    (RunStatus.CANCELLED, None, False, said(HUMAN), True, "was cancelled"),
    (RunStatus.INTERRUPTED, ("INTERRUPTED", "cut"), True, said(HUMAN), True,
     f"call agent again with thread_id {THREAD} and no message"),
    # Cut after its last checkpoint: not resumable, its answer there to give.
    (RunStatus.INTERRUPTED, ("INTERRUPTED", "cut"), False, said(HUMAN, AI), False, "Hello."),
    (RunStatus.INTERRUPTED, ("INTERRUPTED", "cut"), False, said(HUMAN), True, "INTERRUPTED: cut"),
    (RunStatus.RUNNING, None, False, said(HUMAN), True, "is still running"),
])
def test_a_call_answers_what_its_run_ended_with(
    status: RunStatus, error: tuple[str, str] | None, resumable: bool, values: dict[str, Any],
    is_error: bool, says: str,
) -> None:
    result = answer("agent", THREAD, RUN, status, error, resumable, values)
    assert result.isError is is_error and says in text(result)
    assert result.structuredContent == {"thread_id": THREAD, "run_id": RUN, "status": str(status)}
