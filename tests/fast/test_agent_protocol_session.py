"""The thread streaming session's pure part: a run's parts as the session's events, and what a
stream asks for (docs/agent-protocol.md "The thread streaming session"; the real-client tier is
tests/test_agent_protocol_defaults.py)."""

from __future__ import annotations

from typing import Any

import pytest

from api.protocol.stream.messages import ai_chunk, ai_message
from api.protocol.stream.session_events import SessionRun, Subscription, ordinal_of, run_seq
from api.protocol.stream.translate import Part
from shared.errors import BadRequest

META = {"run_id": "r", "thread_id": "t", "langgraph_node": "agent", "nested": {"dropped": True}}


def data(events: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    return [(e["method"], e["params"]["data"]) for e in events]


def test_an_answer_streams_as_blocks_and_its_tool_calls_as_tool_call_blocks() -> None:
    run = SessionRun("r", "t", ordinal=2)
    started = run.started()
    assert started["seq"] == run_seq(2) == 3 << 32 and ordinal_of(started["seq"]) == 2
    first = run.events(5, [Part("messages", [ai_chunk("Let me ", "m1"), META])])
    assert data(first) == [
        ("messages", {"event": "message-start", "role": "ai", "id": "m1",
                      "metadata": {"run_id": "r", "thread_id": "t", "langgraph_node": "agent"}}),
        ("messages", {"event": "content-block-start", "index": 0, "content": {"type": "text", "text": ""}}),
        ("messages", {"event": "content-block-delta", "index": 0,
                      "delta": {"type": "text-delta", "text": "Let me "}}),
    ]
    assert [e["seq"] for e in first] == [run_seq(2) + (5 << 10) + i for i in range(3)]
    call = {"name": "tools__add", "args": {"a": 1}, "id": "c1", "type": "tool_call"}
    done = run.events(6, [
        Part("messages", [ai_chunk("add.", "m1"), META]),
        Part("updates", {"agent": {"messages": [ai_message("Let me add.", "m1", [call])]}}),
    ])
    block = {"type": "tool_call", "id": "c1", "name": "tools__add", "args": {"a": 1}}
    assert data(done)[1:] == [
        ("updates", {"node": "agent", "values": {"messages": [ai_message("Let me add.", "m1", [call])]}}),
        ("messages", {"event": "content-block-finish", "index": 0,
                      "content": {"type": "text", "text": "Let me add."}}),
        ("messages", {"event": "content-block-start", "index": 1, "content": block}),
        ("messages", {"event": "content-block-finish", "index": 1, "content": block}),
        ("messages", {"event": "message-finish"}),
    ]
    # An answer with no token (tool calls only) still starts its message.
    silent = run.events(7, [Part("updates", {"agent": {"messages": [ai_message("", "m2", [call])]}})])
    assert [d.get("event") for _, d in data(silent)[1:3]] == ["message-start", "content-block-start"]


def test_a_runs_end_as_its_lifecycle() -> None:
    asked = SessionRun("r", "t", 0)
    value = {"action_requests": []}
    paused = asked.events(3, [
        Part("updates", {"__interrupt__": [{"id": "i1", "value": value}, {"value": value}]}),
        Part("end", {"run_id": "r", "status": "success"}),
    ])
    assert data(paused) == [
        ("input.requested", {"interrupt_id": "i1", "value": value, "payload": value}),  # decided: no id
        ("lifecycle", {"event": "interrupted", "graph_name": "agent"}),
    ]
    done = SessionRun("r", "t", 0).events(3, [Part("end", {"run_id": "r", "status": "success"})])
    assert data(done) == [("lifecycle", {"event": "completed", "graph_name": "agent"})]
    failed = SessionRun("r", "t", 0).events(3, [
        Part("error", {"error": "AGENT_FAILURE", "message": "the model is gone"}),
        Part("end", {"run_id": "r", "status": "error"}),
    ])
    gone = {"event": "failed", "graph_name": "agent", "error": "the model is gone"}
    assert data(failed) == [("lifecycle", gone)]
    cancelled = SessionRun("r", "t", 0).events(3, [Part("end", {"run_id": "r", "status": "interrupted"})])
    assert data(cancelled)[0][1]["event"] == "failed"


def test_a_subscription_filters_by_channel_namespace_and_since() -> None:
    event = SessionRun("r", "t", 0).started()
    assert Subscription.parse({"channels": ["lifecycle"]}).wants(event)
    assert Subscription.parse({"channels": ["lifecycle"], "namespaces": [[]], "depth": 0}).wants(event)
    assert not Subscription.parse({"channels": ["lifecycle"], "namespaces": [["sub"]]}).wants(event)
    assert not Subscription.parse({"channels": ["values"]}).wants(event)
    assert not Subscription.parse({"channels": ["lifecycle"], "since": event["seq"]}).wants(event)
    assert Subscription.parse({"channels": ["lifecycle"], "since": event["seq"] - 1}).wants(event)
    for body, refused in (
        ({"channels": ["tasks"]}, "channel 'tasks' of threads.stream is not served"),
        ({"channels": ["nonsense"]}, "unknown"),
        ({"channels": ["values"], "since": -1}, "since"),
        ({}, "channels"),
    ):
        with pytest.raises(BadRequest, match=refused):
            Subscription.parse(body)
