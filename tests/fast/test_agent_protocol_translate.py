"""The Agent Protocol's pure parts: statuses, the translation of native events, the parsers
(docs/agent-protocol.md; the real-client tier is tests/test_agent_protocol.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from api.chat.relay import PING
from api.chat.schemas import DecisionBody
from api.conversations.schemas import ConversationInfo
from api.protocol.runs.input import message_of
from api.protocol.runs.interrupts import decisions_of, hitl_value, interrupts_of
from api.protocol.status import run_status, thread_status
from api.protocol.stream.relay import Native, native_events
from api.protocol.stream.translate import (
    VALUES,
    Asked,
    Part,
    Translator,
    ValuesAt,
    after_id,
    number,
    stream_modes,
)
from shared.contracts.runs import RunStatus
from shared.errors import BadRequest

ROOT = Path(__file__).resolve().parents[2]

#: docs/agent-protocol.md, "Statuses": Sophos run status -> the SDK's run status
RUN_TABLE = {
    "queued": "pending", "running": "running", "completed": "success", "failed": "error",
    "interrupted": "interrupted", "cancelled": "interrupted", "waiting": "success",
}


def test_every_run_status_maps_as_the_manual_says() -> None:
    assert {s.value: run_status(s) for s in RunStatus} == RUN_TABLE


def _status_table(path: Path) -> list[list[str]]:
    """The rows of the status table of ``path`` (the one headed "Sophos run status")."""
    lines = [line.strip() for line in path.read_text().splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith("| Sophos run status |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_the_readme_and_the_manual_show_the_same_status_table() -> None:
    readme, manual = (_status_table(ROOT / name) for name in ("README.md", "docs/agent-protocol.md"))
    assert readme == manual
    shown = {row[0].split("`")[1]: row[1].split("`")[1] for row in readme}
    assert shown == RUN_TABLE


def info(status: RunStatus, resumable: bool = False) -> ConversationInfo:
    return ConversationInfo(
        id="c", title="t", created_at="2026-01-01T00:00:00+00:00", updated_at="2026-01-01T00:00:00+00:00",
        message_count=0, status=status, resumable=resumable,
    )


@pytest.mark.parametrize(("status", "resumable", "expected"), [
    (RunStatus.QUEUED, False, "busy"),
    (RunStatus.RUNNING, False, "busy"),
    (RunStatus.COMPLETED, False, "idle"),
    (RunStatus.CANCELLED, False, "idle"),
    (RunStatus.WAITING, False, "interrupted"),
    (RunStatus.INTERRUPTED, True, "interrupted"),
    (RunStatus.INTERRUPTED, False, "idle"),
    (RunStatus.FAILED, False, "error"),
    (RunStatus.FAILED, True, "error"),
])
def test_thread_status(status: RunStatus, resumable: bool, expected: str) -> None:
    assert thread_status(info(status, resumable)) == expected


def test_a_thread_with_no_conversation_yet_is_idle() -> None:
    assert thread_status(None) == "idle"


def translate(modes: tuple[str, ...], events: list[tuple[str, Any]]) -> list[tuple[str, Part | object]]:
    translator = Translator("r", "t", "a", modes)
    out: list[tuple[str, Part | object]] = []
    for n, (event, data) in enumerate(events, start=1):
        out += number(translator.entry(event, data), n)
    return out


RUN = [
    ("trace", {"step": 1, "node": "agent", "event": "enter", "name": "agent"}),
    ("token", "Hel"),
    ("token", "lo"),
    ("trace", {"step": 1, "node": "agent", "event": "call", "name": "echo",
               "data": {"name": "echo", "arguments": {"x": 1}, "tool_call_id": "c1"}}),
    ("trace", {"step": 1, "node": "agent", "event": "leave", "name": "agent"}),
    ("trace", {"step": 2, "node": "tools", "event": "result", "name": "echo",
               "data": {"name": "echo", "result": "1", "tool_call_id": "c1", "status": "success"}}),
    ("end", {"conversation": "t", "run": "r", "status": "completed"}),
]


def test_messages_tuple_is_the_tokens_of_each_turn_then_tool_results() -> None:
    out = translate(("messages-tuple",), RUN)
    messages = [(i, p.data) for i, p in out if isinstance(p, Part) and p.event == "messages"]
    assert [i for i, _ in messages] == ["2-0", "3-0", "6-0"]
    (hel, meta), (lo, _), (tool, tool_meta) = (d for _, d in messages)
    assert (hel["type"], hel["content"], lo["content"]) == ("AIMessageChunk", "Hel", "lo")
    assert hel["id"] == lo["id"] == "run-r-1"
    assert meta["langgraph_node"] == "agent" and meta["run_id"] == "r" and meta["thread_id"] == "t"
    assert tool["type"] == "tool" and tool["tool_call_id"] == "c1" and tool_meta["langgraph_node"] == "tools"
    assert out[-1] == ("7-0", Part("end", {"run_id": "r", "status": "success"}))


def test_updates_are_each_turn_and_each_tool_result() -> None:
    out = translate(("updates",), RUN)
    updates = [p.data for _, p in out if isinstance(p, Part) and p.event == "updates"]
    answer = updates[0]["agent"]["messages"][0]
    assert answer["type"] == "ai" and answer["content"] == "Hello"
    assert answer["tool_calls"] == [{"name": "echo", "args": {"x": 1}, "id": "c1", "type": "tool_call"}]
    assert updates[1]["tools"]["messages"][0]["content"] == "1"


def test_values_come_after_each_step_and_at_the_end_before_error_and_end() -> None:
    out = translate(("values",), RUN)
    # Step 1 begins: the input taken (0 steps done); step 2 begins: the state step 1 left.
    assert out[:2] == [("1-0", ValuesAt(0)), ("6-0", ValuesAt(1))]
    assert out[2:] == [("7-0", VALUES), ("7-1", Part("end", {"run_id": "r", "status": "success"}))]
    failed = [*RUN[:3], ("chat-error", {"status": "interrupted", "code": "INTERRUPTED", "message": "gone"})]
    out = translate(("values",), failed)
    assert [i for i, _ in out] == ["1-0", "4-0", "4-1", "4-2"]
    assert out[1][1] is VALUES
    assert out[2][1] == Part("error", {"error": "INTERRUPTED", "message": "gone"})
    assert out[3][1] == Part("end", {"run_id": "r", "status": "interrupted"})
    assert not [p for _, p in translate(("updates",), RUN) if isinstance(p, ValuesAt)]  # asked only


def test_message_ids_are_the_stored_ones_once_the_worker_names_them() -> None:
    named = [
        RUN[0],
        ("trace", {"step": 1, "node": "agent", "event": "message", "name": "agent", "data": {"id": "lc-1"}}),
        *RUN[1:4],
        ("trace", {"step": 1, "node": "agent", "event": "leave", "name": "agent",
                   "data": {"message_id": "lc-1"}}),
        ("trace", {"step": 2, "node": "tools", "event": "result", "name": "echo",
                   "data": {"name": "echo", "result": "1", "tool_call_id": "c1", "status": "success",
                            "id": "tool-c1"}}),
        RUN[-1],
    ]
    out = translate(("messages-tuple", "updates"), named)
    chunks = [p.data[0]["id"] for _, p in out if isinstance(p, Part) and p.event == "messages"]
    assert chunks == ["lc-1", "lc-1", "tool-c1"]
    updates = [p.data for _, p in out if isinstance(p, Part) and p.event == "updates"]
    assert [u[n]["messages"][0]["id"] for u, n in zip(updates, ("agent", "tools"), strict=True)] == [
        "lc-1", "tool-c1",
    ]
    # Named only at the turn's end (an answer with no text): its update carries the stored id.
    late = [*RUN[:4], named[5], *RUN[5:]]
    out = translate(("updates",), late)
    updates = [p.data for _, p in out if isinstance(p, Part) and p.event == "updates"]
    assert updates[0]["agent"]["messages"][0]["id"] == "lc-1"


def test_other_events_translate_to_nothing() -> None:
    others: list[tuple[str, Any]] = [("approval", {"requests": []}), ("missed", {})]
    assert translate(("values", "messages-tuple"), others) == []
    assert translate(("updates",), [("missed", {})]) == []


def test_an_approval_is_an_interrupt_in_updates() -> None:
    request = {"id": "c1", "name": "tools__add", "arguments": {"a": 1}, "kind": "approval"}
    [(part_id, asked)] = translate(("updates",), [("approval", {"requests": [request]})])
    assert part_id == "1-0" and asked == Asked((request,))


APPROVAL: dict[str, Any] = {
    "id": "c1", "name": "tools__add", "arguments": {"a": 2, "b": 3}, "kind": "approval",
}
UNCERTAIN: dict[str, Any] = {
    "id": "c2", "name": "tools__slow", "arguments": {"s": 1}, "kind": "uncertain", "attempts": 1,
}


def test_requests_show_in_the_middlewares_shape() -> None:
    value = hitl_value({"requests": [APPROVAL, UNCERTAIN, {**APPROVAL, "id": "c3"}]})
    assert [(a["name"], a["args"]) for a in value["action_requests"]] == [
        ("tools__add", {"a": 2, "b": 3}), ("tools__slow", {"s": 1}), ("tools__add", {"a": 2, "b": 3}),
    ]
    approval, uncertain, _ = (a["description"] for a in value["action_requests"])
    assert approval.startswith("Tool execution requires approval") and "may already have run" not in approval
    assert uncertain.startswith("This call may already have run") and "sent 1 time(s)" in uncertain
    assert value["review_configs"] == [
        {"action_name": "tools__add", "allowed_decisions": ["approve", "edit", "reject"]},
        {"action_name": "tools__slow", "allowed_decisions": ["approve", "edit", "reject"]},
    ]
    assert hitl_value({"other": 1}) == {"other": 1}  # a value that is not Sophos's requests: as it is
    shown = hitl_value({"requests": [APPROVAL]})
    assert interrupts_of([("i1", [APPROVAL])]) == [{"value": shown, "id": "i1"}]
    # One request also shows as LangGraph's earlier HumanInterrupt; several only in the new shape.
    assert shown["action_request"] == {"action": "tools__add", "args": {"a": 2, "b": 3}}
    assert shown["description"] == shown["action_requests"][0]["description"]
    assert shown["config"] == {
        "allow_ignore": False, "allow_respond": True, "allow_edit": True, "allow_accept": True
    }
    assert "action_request" not in value and "config" not in value


def test_decisions_map_in_order_onto_the_pending_requests() -> None:
    pending: list[tuple[str, list[dict[str, Any]]]] = [("i1", [APPROVAL]), ("i2", [UNCERTAIN])]
    given = [{"type": "edit", "edited_action": {"name": "tools__add", "args": {"a": 9}}},
             {"type": "reject", "message": "no"}]
    expected = [DecisionBody(id="c1", action="edit", arguments={"a": 9}),
                DecisionBody(id="c2", action="reject", message="no")]
    assert decisions_of({"decisions": given}, pending) == expected
    assert decisions_of({"i2": {"decisions": given[1:]}, "i1": {"decisions": given[:1]}}, pending) == expected
    assert decisions_of({"decisions": [{"type": "approve"}]}, pending[:1]) == [
        DecisionBody(id="c1", action="approve")
    ]
    for wrong, says in [
        ({"decisions": [{"type": "approve"}]}, "1 decision"),
        ({"decisions": [{"type": "approve"}, {"type": "respond"}]}, "type must be"),
        ({"decisions": [{"type": "edit", "edited_action": {"name": "other", "args": {}}},
                        {"type": "approve"}]}, "keeps the tool"),
        ({"decisions": [{"type": "edit"}, {"type": "approve"}]}, "edited_action"),
        ({"i1": {"decisions": [{"type": "approve"}]}}, "no decisions for interrupt"),
        ("approve", "command.resume must be"),
        ({"decisions": [{"type": "approve"}, {"type": "reject", "message": 3}]}, "message must be text"),
    ]:
        with pytest.raises(BadRequest, match=says):
            decisions_of(wrong, pending)


def test_human_responses_map_in_order_onto_the_pending_requests() -> None:
    pending: list[tuple[str, list[dict[str, Any]]]] = [("i1", [APPROVAL])]
    accepted = decisions_of([{"type": "accept", "args": None}], pending)
    assert accepted == [DecisionBody(id="c1", action="approve")]
    edit = {"type": "edit", "args": {"action": "tools__add", "args": {"a": 5, "b": 5}}}
    assert decisions_of([edit], pending) == [DecisionBody(id="c1", action="edit", arguments={"a": 5, "b": 5})]
    assert decisions_of([{"type": "response", "args": "not today"}], pending) == [
        DecisionBody(id="c1", action="reject", message="not today")
    ]
    for wrong, says in [
        ([], "0 response"),
        ([{"type": "accept"}, {"type": "accept"}], "2 response"),
        ([{"type": "ignore", "args": None}], "type must be one of accept, edit, response"),
        (["accept"], "type must be"),
        ([{"type": "response", "args": 3}], "args must be text"),
        ([{"type": "edit", "args": {"action": "tools__add"}}], "args an object"),
        ([{"type": "edit", "args": {"action": "other", "args": {}}}], "keeps the tool"),
    ]:
        with pytest.raises(BadRequest, match=says):
            decisions_of(wrong, pending)


def test_last_event_id() -> None:
    assert after_id(None) == after_id("") == after_id("-1") == (0, -1)
    assert after_id("7-2") == (7, 2)
    assert after_id("7")[0] == 7 and after_id("7") > (7, 999)
    for bad in ("x", "7-", "-2", "1.5", "7-2-1"):
        with pytest.raises(BadRequest):
            after_id(bad)


def test_stream_modes() -> None:
    assert stream_modes(None) == ("values",)
    assert stream_modes("updates") == ("updates",)
    assert stream_modes(["values", "messages-tuple", "values"]) == ("values", "messages-tuple")
    for bad in ("tools", ["values", "lifecycle"], "nope"):
        with pytest.raises(BadRequest):
            stream_modes(bad)


def test_input_is_one_user_message_or_nothing() -> None:
    assert message_of(None) is None and message_of({}) is None and message_of({"messages": []}) is None
    assert message_of({"messages": [{"role": "user", "content": "hi"}]}) == "hi"
    assert message_of({"messages": [{"type": "human", "content": [{"type": "text", "text": "hi"}]}]}) == "hi"
    assert message_of({"messages": ["hi"]}) == "hi"
    bad: dict[str, Any]
    for bad in (
        {"messages": [{"role": "ai", "content": "x"}]}, {"messages": "x"}, {"messages": [1]},
        {"messages": [{"role": "user", "content": 3}]}, {"messages": ["a", "b"]}, {"other": []},
    ):
        with pytest.raises(BadRequest):
            message_of(bad)


def test_the_relays_output_reads_back() -> None:
    token = b'id: 3\r\nevent: token\r\ndata: "a"\r\n\r\n'
    end = b'id: 4\r\nevent: end\r\ndata: {"status":"completed"}\r\n\r\n'
    chunk = token + PING + end
    assert list(native_events(chunk)) == [
        Native(3, "token", "a"), None, Native(4, "end", {"status": "completed"}),
    ]


def test_a_message_refused_over_a_pending_decision_is_an_error_not_a_pause() -> None:
    """Its run ends ``waiting`` (the thread still waits), but it did nothing it was asked to."""
    refused = {"status": "waiting", "code": "APPROVAL_PENDING", "message": "send the decisions first"}
    out = translate(("updates",), [("chat-error", refused)])
    assert [p for _, p in out][-2:] == [
        Part("error", {"error": "APPROVAL_PENDING", "message": "send the decisions first"}),
        Part("end", {"run_id": "r", "status": "error"}),
    ]
    assert run_status(RunStatus.WAITING, "APPROVAL_PENDING") == "error"
    assert run_status(RunStatus.WAITING) == "success"  # a pause for a decision
    assert run_status(RunStatus.FAILED, "APPROVAL_PENDING") == "error"
