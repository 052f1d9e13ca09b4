"""Approve, edit or reject a tool call before it runs: real API, worker, Redis, SQLite, MCP server.

The fake tools server logs every call it executes (``TOOLS_LOG``) before doing its
work, so "never executed" is checked on the tool's side, across worker restarts. The tests that
neither restart nor reconfigure the worker share one worker and API.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.fakes.ollama import FakeOllama, Text, ToolCalls
from tests.support.client import chat, get_json, post_chat, read_sse, tool_calls, wait_for
from tests.support.env import SophosEnv, require_approval
from tests.support.http import http_client
from tests.support.metrics import gauge
from tests.support.stacks import approval_stack


@pytest.fixture(scope="module")
def shared_stack(tmp_path_factory: pytest.TempPathFactory, fake_ollama: FakeOllama) -> Iterator[SophosEnv]:
    """One worker and API for the tests that neither restart nor reconfigure them
    (tests/support/stacks.py), ``add`` needing approval; each test's conversations are its own, and
    each ends them (none is left waiting, so the waiting gauge counts one test's only)."""
    with approval_stack(tmp_path_factory.mktemp("approvals"), fake_ollama) as env:
        yield env


@pytest.fixture
def stack(shared_stack: SophosEnv) -> SophosEnv:
    """The module's worker and API, the tools' log emptied (so it holds this test's calls only)."""
    shared_stack.tools_log.write_text("")
    return shared_stack


def decide(
    api_url: str, conversation: str, decisions: list[dict[str, Any]], **headers: str
) -> httpx.Response:
    with http_client(base_url=api_url, timeout=10.0) as http:
        return http.post(
            "/api/chat", json={"conversation": conversation, "decisions": decisions}, headers=headers
        )


def wait_approval(api_url: str, conversation: str) -> list[dict[str, Any]]:
    """The stream of the run that paused: its approval requests (checked against the detail)."""
    events = read_sse(api_url, conversation)
    assert events.types[-2:] == ["approval", "end"], events.types
    assert events[-1].data["status"] == "waiting"
    approval = events.of("approval")[0].data
    assert approval["conversation"] == conversation and approval["run"] == events[-1].data["run"]
    detail = get_json(api_url, f"/api/conversations/{conversation}")
    assert detail["conversation"]["status"] == "waiting"
    assert detail["resumable"] is False
    assert detail["pendingApproval"] == approval["requests"]
    return list(approval["requests"])


def _error(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code
    return str(response.json()["error"]["message"])


def test_approve_runs_the_call_once_after_the_decision(stack: SophosEnv, model: FakeOllama) -> None:
    model.script(ToolCalls([("tools__add", {"a": 2, "b": 3})]), Text("The sum is 5."))
    conversation, _ = chat(stack.api_url, "add 2 and 3")
    [request] = wait_approval(stack.api_url, conversation)
    assert request["name"] == "tools__add" and request["arguments"] == {"a": 2, "b": 3}
    assert tool_calls(stack.tools_log, "add") == []
    assert len(model.requests) == 1
    assert gauge(stack.api_url, "sophos_conversations_waiting") == 1

    accepted = decide(stack.api_url, conversation, [{"id": request["id"], "action": "approve"}])
    assert accepted.status_code == 202, accepted.text
    events = read_sse(stack.api_url, conversation)
    assert events[-1].data == {
        "conversation": conversation,
        "run": accepted.json()["run"],
        "status": "completed",
    }
    assert events.text == "The sum is 5."
    assert [c["args"] for c in tool_calls(stack.tools_log, "add")] == [{"a": 2, "b": 3}]
    detail = get_json(stack.api_url, f"/api/conversations/{conversation}")
    assert detail["pendingApproval"] is None and detail["conversation"]["status"] == "completed"
    assert gauge(stack.api_url, "sophos_conversations_waiting") == 0
    assert [m["role"] for m in detail["messages"]] == ["user", "assistant", "tool", "assistant"]
    # Acted on once: the same decision again finds nothing pending.
    _error(
        decide(stack.api_url, conversation, [{"id": request["id"], "action": "approve"}]),
        409,
        "NO_APPROVAL_PENDING",
    )
    assert len(tool_calls(stack.tools_log, "add")) == 1


def test_reject_never_runs_the_call_and_the_model_hears_why(stack: SophosEnv, model: FakeOllama) -> None:
    model.script(ToolCalls([("tools__add", {"a": 2, "b": 3})]), Text("Understood, I will not add."))
    conversation, _ = chat(stack.api_url, "add 2 and 3")
    [request] = wait_approval(stack.api_url, conversation)
    accepted = decide(
        stack.api_url,
        conversation,
        [
            {"id": request["id"], "action": "reject", "message": "not today"},
        ],
    )
    assert accepted.status_code == 202, accepted.text
    events = read_sse(stack.api_url, conversation)
    assert events[-1].data["status"] == "completed"
    assert tool_calls(stack.tools_log, "add") == []
    told = model.requests[1]["messages"][-1]
    assert told["role"] == "tool" and "rejected" in told["content"] and "not today" in told["content"]


def test_edit_runs_with_the_new_arguments(stack: SophosEnv, model: FakeOllama) -> None:
    model.script(ToolCalls([("tools__add", {"a": 2, "b": 3})]), Text("The sum is 50."))
    conversation, _ = chat(stack.api_url, "add 2 and 3")
    [request] = wait_approval(stack.api_url, conversation)
    _error(decide(stack.api_url, conversation, [{"id": request["id"], "action": "edit"}]), 400, "BAD_REQUEST")
    accepted = decide(
        stack.api_url,
        conversation,
        [
            {"id": request["id"], "action": "edit", "arguments": {"a": 20, "b": 30}},
        ],
    )
    assert accepted.status_code == 202, accepted.text
    assert read_sse(stack.api_url, conversation)[-1].data["status"] == "completed"
    assert [c["args"] for c in tool_calls(stack.tools_log, "add")] == [{"a": 20, "b": 30}]
    assert model.requests[1]["messages"][-1]["content"] == "50"
    messages = get_json(stack.api_url, f"/api/conversations/{conversation}")["messages"]
    assert messages[1]["toolCalls"][0]["arguments"] == {"a": 20, "b": 30}


def test_the_detail_and_both_exports_show_each_request_and_its_decision(
    stack: SophosEnv, model: FakeOllama
) -> None:
    model.script(
        ToolCalls([("tools__add", {"a": 1, "b": 1}), ("tools__add", {"a": 2, "b": 2})]), Text("Done."),
    )
    conversation, _ = chat(stack.api_url, "two sums")
    first, second = (r["id"] for r in wait_approval(stack.api_url, conversation))
    waiting = get_json(stack.api_url, f"/api/conversations/{conversation}/export", raw=True)
    assert "Status: waiting" in waiting and "Waiting for the user's decision" in waiting

    accepted = decide(
        stack.api_url,
        conversation,
        [
            {"id": first, "action": "edit", "arguments": {"a": 10, "b": 10}},
            {"id": second, "action": "reject", "message": "too small"},
        ],
    )
    assert accepted.status_code == 202, accepted.text
    assert read_sse(stack.api_url, conversation)[-1].data["status"] == "completed"

    detail = get_json(stack.api_url, f"/api/conversations/{conversation}")
    calls = detail["messages"][1]["toolCalls"]
    # The edited call ran once (the ledger has it); the rejected one was never sent (it has none).
    ledger = calls[0].pop("ledger")
    assert ledger["state"] == "done" and ledger["attempts"] == 1 and ledger["key"]
    assert calls == [
        {"id": first, "name": "tools__add", "arguments": {"a": 10, "b": 10},
         "approval": {"action": "edit", "proposedArguments": {"a": 1, "b": 1}, "decidedBy": "local"}},
        {"id": second, "name": "tools__add", "arguments": {"a": 2, "b": 2},
         "approval": {"action": "reject", "proposedArguments": {"a": 2, "b": 2}, "message": "too small",
                      "decidedBy": "local"}},
    ]

    markdown = get_json(stack.api_url, f"/api/conversations/{conversation}/export", raw=True)
    assert "Waiting for the user's decision" not in markdown
    assert '*Edited by the user before it ran*; the model proposed `{"a": 1, "b": 1}`.' in markdown
    assert "*Rejected by the user: too small* (not run)." in markdown

    jsonl = get_json(stack.api_url, f"/api/conversations/{conversation}/export?format=jsonl", raw=True)
    decided = [
        call["approval"]
        for line in map(json.loads, jsonl.splitlines())
        for message in line["messages"]
        for call in message.get("toolCalls", [])
        if "approval" in call
    ]
    assert decided == [c["approval"] for c in calls]


def test_calls_of_one_turn_wait_together_then_run_with_their_decisions(
    stack: SophosEnv, model: FakeOllama
) -> None:
    model.script(
        ToolCalls(
            [
                ("tools__add", {"a": 1, "b": 1}),
                ("tools__add", {"a": 2, "b": 2}),
                ("tools__echo", {"text": "free"}),
            ]
        ),
        Text("Done."),
    )
    conversation, _ = chat(stack.api_url, "three calls")
    requests = wait_approval(stack.api_url, conversation)
    assert [r["arguments"] for r in requests] == [{"a": 1, "b": 1}, {"a": 2, "b": 2}]  # echo needs none
    assert tool_calls(stack.tools_log) == []  # not even the call that needs no approval

    first, second = (r["id"] for r in requests)
    # Every pending request gets exactly one decision.
    message = _error(
        decide(stack.api_url, conversation, [{"id": first, "action": "approve"}]), 400, "BAD_REQUEST"
    )
    assert second in message
    message = _error(
        decide(
            stack.api_url,
            conversation,
            [
                {"id": first, "action": "approve"},
                {"id": second, "action": "approve"},
                {"id": "nope", "action": "approve"},
            ],
        ),
        400,
        "BAD_REQUEST",
    )
    assert "nope" in message
    message = _error(
        decide(
            stack.api_url,
            conversation,
            [
                {"id": first, "action": "approve"},
                {"id": first, "action": "reject"},
                {"id": second, "action": "approve"},
            ],
        ),
        400,
        "BAD_REQUEST",
    )
    assert first in message
    _error(decide(stack.api_url, conversation, [{"id": first, "action": "maybe"}]), 400, "BAD_REQUEST")
    # Waiting: no new message, no resume.
    _error(post_chat(stack.api_url, "another", conversation), 409, "APPROVAL_PENDING")
    _error(post_chat(stack.api_url, None, conversation, resume=True), 409, "APPROVAL_PENDING")
    assert tool_calls(stack.tools_log) == []

    accepted = decide(
        stack.api_url,
        conversation,
        [
            {"id": first, "action": "approve"},
            {"id": second, "action": "reject"},
        ],
    )
    assert accepted.status_code == 202, accepted.text
    assert read_sse(stack.api_url, conversation)[-1].data["status"] == "completed"
    assert [c["args"] for c in tool_calls(stack.tools_log, "add")] == [{"a": 1, "b": 1}]
    assert [c["args"] for c in tool_calls(stack.tools_log, "echo")] == [{"text": "free"}]
    results = [m for m in model.requests[1]["messages"] if m["role"] == "tool"]
    assert len(results) == 3 and any("rejected" in r["content"] for r in results)


def test_decision_without_a_pending_approval_is_refused(stack: SophosEnv, model: FakeOllama) -> None:
    model.script(Text("No tools needed."))
    conversation, _ = chat(stack.api_url, "hello")
    assert read_sse(stack.api_url, conversation)[-1].data["status"] == "completed"
    _error(
        decide(stack.api_url, conversation, [{"id": "x", "action": "approve"}]), 409, "NO_APPROVAL_PENDING"
    )
    assert get_json(stack.api_url, f"/api/conversations/{conversation}")["pendingApproval"] is None


def test_the_same_decision_posted_twice_with_a_key_runs_the_tool_once(
    stack: SophosEnv, model: FakeOllama
) -> None:
    model.script(ToolCalls([("tools__add", {"a": 4, "b": 4})]), Text("8."))
    conversation, _ = chat(stack.api_url, "add")
    [request] = wait_approval(stack.api_url, conversation)
    decision = [{"id": request["id"], "action": "approve"}]
    one = decide(stack.api_url, conversation, decision, **{"Idempotency-Key": "k-1"})
    two = decide(stack.api_url, conversation, decision, **{"Idempotency-Key": "k-1"})
    assert one.status_code == two.status_code == 202 and one.json() == two.json()
    assert read_sse(stack.api_url, conversation)[-1].data["status"] == "completed"
    assert len(tool_calls(stack.tools_log, "add")) == 1


def test_a_waiting_conversation_survives_sigkill_and_the_decision_works(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    require_approval(sophos_env, True)
    worker = start_worker(sophos_env)
    start_api(sophos_env)
    model.script(ToolCalls([("tools__echo", {"text": "after the crash"})]), Text("Echoed."))
    conversation, run = chat(sophos_env.api_url, "echo it")
    [request] = wait_approval(sophos_env.api_url, conversation)
    worker.kill()
    worker.wait()
    start_worker(sophos_env)  # start-up recovery runs before it is ready

    detail = get_json(sophos_env.api_url, f"/api/conversations/{conversation}")
    assert detail["conversation"]["status"] == "waiting"
    assert detail["pendingApproval"] == [request]
    assert get_json(sophos_env.api_url, f"/api/runs/{run}")["status"] == "waiting"
    waiting = get_json(sophos_env.api_url, "/api/runs?status=waiting")["runs"]
    assert [r["id"] for r in waiting] == [run]
    assert tool_calls(sophos_env.tools_log) == []

    accepted = decide(sophos_env.api_url, conversation, [{"id": request["id"], "action": "approve"}])
    assert accepted.status_code == 202, accepted.text
    wait_for(lambda: read_sse(sophos_env.api_url, conversation)[-1].data["status"] == "completed", 30)
    assert [c["args"] for c in tool_calls(sophos_env.tools_log, "echo")] == [{"text": "after the crash"}]


def test_sigkill_during_the_approved_tool_asks_again_before_it_is_sent_again(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    require_approval(sophos_env, ["slow"], safe_to_repeat=False)
    worker = start_worker(sophos_env)
    start_api(sophos_env)
    model.script(ToolCalls([("tools__slow", {"seconds": 1.5})]), Text("All done."))
    conversation, _ = chat(sophos_env.api_url, "do the slow thing")
    [request] = wait_approval(sophos_env.api_url, conversation)
    accepted = decide(sophos_env.api_url, conversation, [{"id": request["id"], "action": "approve"}])
    assert accepted.status_code == 202, accepted.text
    decided = accepted.json()["run"]
    wait_for(lambda: tool_calls(sophos_env.tools_log, "slow"), timeout=20)
    worker.kill()
    worker.wait()
    start_worker(sophos_env)

    assert get_json(sophos_env.api_url, f"/api/runs/{decided}")["status"] == "interrupted"
    detail = get_json(sophos_env.api_url, f"/api/conversations/{conversation}")
    assert detail["resumable"] is True and detail["pendingApproval"] is None
    _error(
        decide(sophos_env.api_url, conversation, [{"id": request["id"], "action": "approve"}]),
        409,
        "NO_APPROVAL_PENDING",
    )

    # The approved call may have run: approving it once was not approving it twice.
    chat(sophos_env.api_url, conversation=conversation, resume=True)
    [uncertain] = wait_approval(sophos_env.api_url, conversation)
    assert uncertain == {**request, "kind": "uncertain", "attempts": 1}
    assert len(tool_calls(sophos_env.tools_log, "slow")) == 1
    again = decide(sophos_env.api_url, conversation, [{"id": request["id"], "action": "approve"}])
    assert again.status_code == 202, again.text
    events = read_sse(sophos_env.api_url, conversation)
    assert events[-1].data == {
        "conversation": conversation, "run": again.json()["run"], "status": "completed",
    }
    assert events.text == "All done."
    sent = tool_calls(sophos_env.tools_log, "slow")
    assert len(sent) == 2 and sent[0]["key"] == sent[1]["key"]  # sent once more, with its key


def test_approval_timeout_rejects_overdue_calls_after_a_restart_and_leaves_the_others(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    """The deadline counts from the waiting run's end as the database has it, across restarts."""
    require_approval(sophos_env, ["add"])
    worker = start_worker(sophos_env)
    start_api(sophos_env)
    model.script(ToolCalls([("tools__add", {"a": 1, "b": 2})]))
    overdue, overdue_run = chat(sophos_env.api_url, "add 1 and 2")
    [overdue_request] = wait_approval(sophos_env.api_url, overdue)
    model.script(ToolCalls([("tools__add", {"a": 3, "b": 4})]))
    fresh, _ = chat(sophos_env.api_url, "add 3 and 4")
    [fresh_request] = wait_approval(sophos_env.api_url, fresh)
    worker.kill()
    worker.wait()
    # The first has waited for two minutes (as recorded); the second just started waiting.
    with sqlite3.connect(sophos_env.database_path) as db:
        db.execute(
            "UPDATE runs SET finished_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-120 seconds')"
            " WHERE id = ?",
            (overdue_run,),
        )

    model.script(Text("I did not add them: no decision came."))
    start_worker(sophos_env.with_(APPROVAL_TIMEOUT=60))
    wait_for(lambda: get_json(sophos_env.api_url, f"/api/conversations/{overdue}")["conversation"]["status"]
             == "completed", 30)
    events = read_sse(sophos_env.api_url, overdue)
    assert events[-1].data["status"] == "completed" and events.text == "I did not add them: no decision came."
    assert tool_calls(sophos_env.tools_log, "add") == []
    told = model.requests[-1]["messages"][-1]
    assert told["role"] == "tool"
    assert "rejected" in told["content"] and "no decision within 60 s" in told["content"]
    calls = get_json(sophos_env.api_url, f"/api/conversations/{overdue}")["messages"][1]["toolCalls"]
    assert calls[0]["id"] == overdue_request["id"] and calls[0]["approval"] == {
        "action": "reject", "proposedArguments": {"a": 1, "b": 2}, "message": "no decision within 60 s",
    }

    # A pass of the sweep has run since: the conversation waiting for less than the timeout waits on.
    detail = get_json(sophos_env.api_url, f"/api/conversations/{fresh}")
    assert detail["conversation"]["status"] == "waiting" and detail["pendingApproval"] == [fresh_request]
    model.script(Text("The sum is 7."))
    accepted = decide(sophos_env.api_url, fresh, [{"id": fresh_request["id"], "action": "approve"}])
    assert accepted.status_code == 202, accepted.text
    assert read_sse(sophos_env.api_url, fresh)[-1].data["status"] == "completed"
    assert [c["args"] for c in tool_calls(sophos_env.tools_log, "add")] == [{"a": 3, "b": 4}]
