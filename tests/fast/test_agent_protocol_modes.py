"""The step stream modes (api/protocol/stream/modes.py): ``messages``, ``tasks``, ``checkpoints``,
``debug`` and ``events``, translated from a run's native events, in the SDK's shapes."""

from __future__ import annotations

from typing import Any

from api.protocol.stream.modes import CheckpointAt, checkpoint_event, checkpoint_payload
from api.protocol.stream.translate import Part, Translator, number, stream_modes

RUN: list[tuple[str, Any]] = [
    ("trace", {"step": 1, "node": "agent", "event": "enter", "name": "agent", "data": {"task": "t-agent"}}),
    ("trace", {"step": 1, "node": "agent", "event": "message", "name": "agent", "data": {"id": "m1"}}),
    ("token", "Hel"),
    ("token", "lo"),
    ("trace", {"step": 1, "node": "agent", "event": "call", "name": "echo",
               "data": {"name": "echo", "arguments": {"x": 1}, "tool_call_id": "c1"}}),
    ("trace", {"step": 1, "node": "agent", "event": "leave", "name": "agent",
               "data": {"message_id": "m1", "task": "t-agent"}}),
    ("trace", {"step": 2, "node": "tools", "event": "enter", "name": "tools"}),
    ("trace", {"step": 2, "node": "tools", "event": "result", "name": "echo",
               "data": {"name": "echo", "result": "1", "tool_call_id": "c1", "status": "success",
                        "id": "m2"}}),
    ("trace", {"step": 2, "node": "tools", "event": "leave", "name": "tools"}),
    ("end", {"conversation": "t", "run": "r", "status": "completed"}),
]


def translate(modes: tuple[str, ...]) -> list[tuple[str, Any]]:
    translator = Translator("r", "t", "a", modes)
    out: list[tuple[str, Any]] = []
    for n, (event, data) in enumerate(RUN, start=1):
        out += number(translator.entry(event, data), n)
    return out


def events(out: list[tuple[str, Any]], name: str) -> list[Any]:
    return [p.data for _, p in out if isinstance(p, Part) and p.event == name]


def test_the_step_modes_are_served() -> None:
    assert stream_modes(["messages", "tasks", "checkpoints", "debug", "events"]) == (
        "messages", "tasks", "checkpoints", "debug", "events",
    )


def test_messages_are_metadata_then_partials_then_complete() -> None:
    out = translate(("messages",))
    kinds = [p.event for _, p in out if isinstance(p, Part)]
    assert kinds == [
        "messages/metadata", "messages/partial", "messages/partial", "messages/complete",
        "messages/metadata", "messages/complete", "end",
    ]
    metadata = events(out, "messages/metadata")
    assert metadata[0]["m1"]["metadata"]["langgraph_node"] == "agent"
    assert metadata[1]["m2"]["metadata"]["langgraph_node"] == "tools"
    partials = events(out, "messages/partial")
    assert [p[0]["content"] for p in partials] == ["Hel", "Hello"]  # the answer so far
    assert partials[0][0]["type"] == "ai" and partials[0][0]["id"] == "m1"
    answer, result = (c[0] for c in events(out, "messages/complete"))
    assert answer["content"] == "Hello" and answer["tool_calls"][0]["id"] == "c1"
    assert result["type"] == "tool" and result["id"] == "m2"


def test_tasks_are_each_nodes_start_and_result() -> None:
    out = translate(("tasks",))
    start, done, tool_start, tool_done = events(out, "tasks")
    assert start == {"id": "t-agent", "name": "agent", "input": None, "triggers": ["branch:to:agent"]}
    assert done["id"] == "t-agent" and done["error"] is None and done["interrupts"] == []
    assert done["result"]["messages"][0]["content"] == "Hello"
    # A task the worker did not name gets an id of its own, the same at its start and end.
    assert tool_start["name"] == "tools" and tool_done["id"] == tool_start["id"] != "t-agent"
    assert tool_done["result"]["messages"][0]["tool_call_id"] == "c1"


def test_checkpoints_and_debug_come_after_each_step_and_at_the_end() -> None:
    out = translate(("checkpoints",))
    assert [(i, p) for i, p in out if isinstance(p, CheckpointAt)] == [
        ("1-0", CheckpointAt(0, "checkpoints")), ("7-0", CheckpointAt(1, "checkpoints")),
        ("10-0", CheckpointAt(None, "checkpoints")),
    ]
    out = translate(("debug",))
    debug = events(out, "debug")
    assert [d["type"] for d in debug] == ["task", "task_result", "task", "task_result"]
    assert debug[0]["step"] == 1 and debug[0]["payload"]["name"] == "agent" and debug[0]["timestamp"]
    assert [p for _, p in out if isinstance(p, CheckpointAt)][-1] == CheckpointAt(None, "debug")


STATE = {
    "values": {"messages": []}, "next": ["agent"],
    "tasks": [{"id": "k", "name": "agent", "error": None, "interrupts": [], "checkpoint": None,
               "state": None, "result": None}],
    "checkpoint": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "c2"},
    "parent_checkpoint": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "c1"},
    "metadata": {"step": 3, "source": "loop"}, "created_at": "2026-01-01T00:00:00+00:00", "interrupts": [],
}


def test_a_checkpoint_is_sent_in_the_sdks_shape() -> None:
    payload = checkpoint_payload(STATE)
    configurable = {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "c2"}
    assert payload["config"] == {"configurable": configurable}
    assert payload["parent_config"]["configurable"]["checkpoint_id"] == "c1"
    assert payload["next"] == ["agent"] and payload["tasks"] == [
        {"id": "k", "name": "agent", "interrupts": [], "state": None},
    ]
    assert checkpoint_event("checkpoints", STATE) == payload
    assert checkpoint_event("debug", STATE) == {
        "type": "checkpoint", "timestamp": STATE["created_at"], "step": 3, "payload": payload,
    }


def test_events_are_astream_events_of_the_graph_its_nodes_and_its_model() -> None:
    out = translate(("events",))
    seen = [(e["event"], e["name"]) for e in events(out, "events")]
    assert seen == [
        ("on_chain_start", "LangGraph"), ("on_chain_start", "agent"),
        ("on_chat_model_start", "model"),
        ("on_chat_model_stream", "model"), ("on_chat_model_stream", "model"),
        ("on_chat_model_end", "model"), ("on_chain_end", "agent"),
        ("on_chain_start", "tools"), ("on_tool_end", "echo"), ("on_chain_end", "tools"),
        ("on_chain_end", "LangGraph"),
    ]
    every = events(out, "events")
    assert every[3]["data"]["chunk"]["content"] == "Hel"
    assert len({e["run_id"] for e in every[2:6]}) == 1  # one model call
    assert all(e["parent_ids"] == ["r"] for e in every[1:-1])
