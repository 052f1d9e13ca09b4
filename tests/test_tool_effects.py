"""Tool calls and their effects (issue 29, parts 1-4): one task per call, the ledger, the key,
and calls that may have run put to a person.

Real worker, API, Redis and database (SQLite file, or PostgreSQL where marked
``backends``); the fake tools server logs each execution with the idempotency key it
received in the request's ``_meta`` (tests/fakes/tools_server.py), so executions are
counted per key across worker processes.
"""

from __future__ import annotations

import json
import signal
import sqlite3
from collections import Counter
from collections.abc import Sequence
from typing import Any

import httpx
import pytest

from tests.fakes.ollama import FakeOllama, Text, ToolCalls
from tests.support.client import get_json, read_sse, tool_calls, wait_for
from tests.support.env import SophosEnv, mcp_servers, not_safe_to_repeat
from tests.support.faults import (
    accepted,
    call_counters,
    database_integrity,
    ledger_rows,
    recorded_after_crash,
)

pytestmark = [pytest.mark.fault, pytest.mark.backends]

#: three calls of one turn: a fast one, one that finishes in half a second, one still running
FAST = ("tools__echo", {"text": "three"})
DONE = ("tools__slow", {"seconds": 0.5})
RUNNING = ("tools__slow", {"seconds": 3.0})


@pytest.fixture
def env(sophos_env: SophosEnv) -> SophosEnv:
    """Only the fake tools server (the fetch server would cost each worker start)."""
    tools = mcp_servers(sophos_env.tools_log, sophos_env.root)["mcpServers"]["tools"]  # type: ignore[index]
    # Taken as tools that act: a call that may have run is asked about (safeToRepeat: false).
    sophos_env.write_mcp_config(not_safe_to_repeat({"mcpServers": {"tools": tools}}))
    return sophos_env


def executions(env: SophosEnv, tool: str, **args: Any) -> list[str | None]:
    """The keys the tools server received for each execution of ``tool`` with ``args``."""
    return [e.get("key") for e in tool_calls(env.tools_log, tool) if e["args"] == args]


def _killed_mid_turn(
    env: SophosEnv, start_worker, start_api, model: FakeOllama, *, safe: bool = False
) -> tuple[str, str, Any]:
    """Three calls, three tasks; the worker killed right after the second outcome commit (before
    LangGraph saved that task's writes) while the third runs. Returns the API, the conversation
    and the worker started after it."""
    model.script(ToolCalls([FAST, DONE, RUNNING]), Text("All three done."))
    # Outcome 1: the echo; outcome 2: the half-second sleep. Killed right after that commit.
    doomed = start_worker(env.with_(SOPHOS_FAULT_KILL_AFTER_OUTCOME=2))
    api = start_api(env).url
    conversation, run = accepted(api, "three things at once")
    assert doomed.wait(30) == -signal.SIGKILL
    assert executions(env, "slow", seconds=3.0) != []  # the third was in flight

    survivor = start_worker(env)
    assert recorded_after_crash(api, run)["status"] == "interrupted"
    first = read_sse(api, conversation)
    # One LangGraph task per call: three "enter"s of the tools node in one step.
    enters = [e.data for e in first.of("trace") if e.data["event"] == "enter" and e.data["node"] == "tools"]
    assert len(enters) == 3 and len({e["step"] for e in enters}) == 1
    detail = get_json(api, f"/api/conversations/{conversation}")
    assert detail["resumable"] is True
    before = {r["tool_call_id"]: r for r in ledger_rows(env, conversation)}
    assert sorted(r["state"] for r in before.values()) == ["done", "done", "intent"]
    # The detail shows what the ledger knows of each call, and what a resume will do.
    [calling] = [m for m in detail["messages"] if m.get("toolCalls")]
    assert {c["id"]: c["ledger"] for c in calling["toolCalls"]} == {
        i: {"state": r["state"], "attempts": 1, "key": r["key"]} for i, r in before.items()
    }
    answered = {m["toolCallId"] for m in detail["messages"] if m["role"] == "tool"}
    running = next(i for i, r in before.items() if r["state"] == "intent")
    expected = {i: "answer" for i, r in before.items() if r["state"] == "done" and i not in answered}
    assert {p["id"]: p["action"] for p in detail["resumePlan"]} == {
        **expected, running: "resend" if safe else "ask",
    }
    return api, conversation, survivor


def _executed_once_each_and_whole(
    env: SophosEnv, api: str, conversation: str, workers: Sequence[Any], last_run: str
) -> None:
    """Executed once each, whatever LangGraph had saved (the ledger answered the finished
    calls); the call in flight twice, with one key; the transcript whole."""
    fast = executions(env, "echo", text="three")
    done = executions(env, "slow", seconds=0.5)
    running = executions(env, "slow", seconds=3.0)
    assert len(fast) == 1 and len(done) == 1
    assert len(running) == 2 and running[0] == running[1]
    keys = {fast[0], done[0], running[0]}
    assert None not in keys and len(keys) == 3

    rows = {r["key"]: r for r in ledger_rows(env, conversation)}
    assert set(rows) == keys
    assert {k: (r["state"], r["attempt"]) for k, r in rows.items()} == {
        fast[0]: ("done", 1), done[0]: ("done", 1), running[0]: ("done", 2),
    }
    assert rows[running[0]]["run_id"] == last_run
    # Killed right after its outcome commit, the half-second call's task had no writes saved:
    # LangGraph ran it again, and the ledger answered it.
    answered = {r.get("tool_call_id") for worker in workers for r in worker.log_records()
                if r.get("event") == "tool_call.answered_from_ledger"}
    assert rows[done[0]]["tool_call_id"] in answered

    detail = get_json(api, f"/api/conversations/{conversation}")
    roles = [m["role"] for m in detail["messages"]]
    assert roles == ["user", "assistant", "tool", "tool", "tool", "assistant"]
    results = {m["toolCallId"]: m["content"] for m in detail["messages"] if m["role"] == "tool"}
    by_key = {r["tool_call_id"]: r["key"] for r in rows.values()}
    assert {by_key[c]: text for c, text in results.items()} == {
        fast[0]: "three", done[0]: "slept 0.5s", running[0]: "slept 3.0s",
    }
    assert detail["resumable"] is False
    # Both exports say how often each call was sent, with which key.
    markdown = get_json(api, f"/api/conversations/{conversation}/export", raw=True)
    assert f"*Sent 2 times (idempotency key `{running[0]}`), its outcome recorded.*" in markdown
    assert f"*Sent once (idempotency key `{fast[0]}`), its outcome recorded.*" in markdown
    jsonl = get_json(api, f"/api/conversations/{conversation}/export", raw=True, format="jsonl")
    exported = {c["ledger"]["key"]: c["ledger"] for line in jsonl.splitlines()
                for m in json.loads(line)["messages"] for c in m.get("toolCalls", [])}
    assert {k: (v["state"], v["attempts"]) for k, v in exported.items()} == {
        fast[0]: ("done", 1), done[0]: ("done", 1), running[0]: ("done", 2),
    }
    assert database_integrity(env) == "ok"


def test_a_call_that_may_have_run_is_put_to_a_person_and_approve_sends_it_again_with_its_key(
    env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    """The finished calls are answered from the ledger; the one in flight (``slow``: not safe to
    repeat) stops the resume: the run ends ``waiting`` with an ``uncertain`` request, and only
    the decision sends it again, with the same key."""
    api, conversation, survivor = _killed_mid_turn(env, start_worker, start_api, model)
    counted = call_counters(api)

    _, resumed = accepted(api, conversation=conversation, resume=True)
    events = read_sse(api, conversation)
    assert events.types[-2:] == ["approval", "end"] and events[-1].data == {
        "conversation": conversation, "run": resumed, "status": "waiting",
    }
    running_call = next(r["tool_call_id"] for r in ledger_rows(env, conversation) if r["state"] == "intent")
    requests = events.of("approval")[0].data["requests"]
    assert requests == [{
        "id": running_call, "name": "tools__slow", "arguments": {"seconds": 3.0}, "kind": "uncertain",
        "attempts": 1,
    }]
    assert len(executions(env, "slow", seconds=3.0)) == 1  # not sent again before the decision
    detail = get_json(api, f"/api/conversations/{conversation}")
    assert detail["conversation"]["status"] == "waiting" and detail["pendingApproval"] == requests
    # A question asked survives kill -9: the next worker finds it still waiting.
    survivor.kill()
    assert survivor.wait(10) == -signal.SIGKILL
    last = start_worker(env)
    wait_for(lambda: any(r.get("event") == "worker.ready" for r in last.log_records()),
             message="the next worker")
    detail = get_json(api, f"/api/conversations/{conversation}")
    assert detail["conversation"]["status"] == "waiting" and detail["pendingApproval"] == requests
    assert len(executions(env, "slow", seconds=3.0)) == 1

    with httpx.Client(base_url=api, timeout=10.0, trust_env=False) as http:
        decided = http.post("/api/chat", json={
            "conversation": conversation, "decisions": [{"id": running_call, "action": "approve"}],
        })
    assert decided.status_code == 202, decided.text
    events = read_sse(api, conversation)
    assert events[-1].event == "end" and events[-1].data["run"] == decided.json()["run"]
    assert events.text == "All three done."
    _executed_once_each_and_whole(env, api, conversation, (survivor, last), decided.json()["run"])
    # /metrics: the finished call answered from the ledger, the uncertain one sent again as decided.
    moved = call_counters(api) - counted
    assert moved["sophos_tool_calls_repeated_total:decided"] == 1
    assert moved["sophos_tool_calls_total:answered"] >= 1 and moved["sophos_tool_calls_total:success"] == 1


def test_a_call_safe_to_repeat_is_sent_again_with_its_key_without_asking(
    env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    """``safeToRepeat`` in mcp.json (as the tool's own ``idempotentHint`` would): the resume sends
    the call in flight again, with the same key, and asks no one."""
    config = json.loads((env.config_dir / "mcp.json").read_text())
    config["mcpServers"]["tools"]["safeToRepeat"] = ["slow"]
    env.write_mcp_config(config)
    api, conversation, survivor = _killed_mid_turn(env, start_worker, start_api, model, safe=True)
    counted = call_counters(api)

    _, resumed = accepted(api, conversation=conversation, resume=True)
    events = read_sse(api, conversation)
    assert events[-1].event == "end" and events[-1].data["run"] == resumed
    assert "approval" not in events.types and events.text == "All three done."
    again = [r for r in survivor.log_records() if r.get("event") == "tool_call.sent_again"]
    assert [(r["tool"], r["reason"]) for r in again] == [("tools__slow", "safe_to_repeat")]
    _executed_once_each_and_whole(env, api, conversation, (survivor,), resumed)
    moved = call_counters(api) - counted
    assert moved["sophos_tool_calls_repeated_total:safe_to_repeat"] == 1 and "decided" not in str(moved)


def test_each_call_has_its_key_and_its_ledger_row_which_go_with_the_conversation(
    env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    model.script(
        ToolCalls([("tools__echo", {"text": "a"}), ("tools__add", {"a": 1, "b": 2})]), Text("first"),
        ToolCalls([("tools__echo", {"text": "a"})]), Text("second"),
    )
    start_worker(env)
    api = start_api(env).url
    conversation, _ = accepted(api, "two calls")
    assert read_sse(api, conversation).text == "first"
    accepted(api, "the same call again", conversation)
    assert read_sse(api, conversation).text == "second"

    sent = [str(e.get("key")) for e in tool_calls(env.tools_log)]
    assert len(sent) == 3 and "None" not in sent and len(set(sent)) == 3  # the same call twice: two keys
    rows = ledger_rows(env, conversation)
    assert sorted(r["key"] for r in rows) == sorted(sent)
    assert all(r["state"] == "done" and r["attempt"] == 1 and r["status"] == "success" for r in rows)
    assert sorted(r["result"] for r in rows) == ['"3"', '"a"', '"a"']
    assert Counter(r["tool"] for r in rows) == {"tools__echo": 2, "tools__add": 1}

    model.script(Text("kept"))
    other, _ = accepted(api, "another conversation")
    read_sse(api, other)
    with httpx.Client(base_url=api, timeout=15, trust_env=False) as http:
        response = http.delete(f"/api/conversations/{conversation}")
    assert response.status_code in (202, 204), response.text
    wait_for(lambda: ledger_rows(env, conversation) == [], timeout=15, message="ledger rows deleted")
    assert get_json(api, f"/api/conversations/{conversation}", expect=404) is not None


def test_a_call_whose_intent_is_refused_is_never_sent_and_the_turn_resumes_when_it_is_taken(
    env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    """The database refuses the intent (here a trigger, as a damaged file or a bug would; a
    locked or full file is ``DATABASE_UNAVAILABLE``, tests/test_faults_infra.py): the request
    never leaves, the run fails resumable, and once the database takes it the resume sends the
    call once."""
    if env.get("DATABASE_URL"):
        pytest.skip("a SQLite trigger refuses the intent (the same code runs on PostgreSQL)")
    model.script(ToolCalls([FAST]), Text("Sent once."))
    start_worker(env)
    api = start_api(env).url
    conn = sqlite3.connect(env.database_path, timeout=10)
    try:
        wait_for(lambda: conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'tool_calls'")
                 .fetchone()[0] == 1, message="the worker's migrations")
        conn.execute(
            "CREATE TRIGGER test_refuse_intents BEFORE INSERT ON tool_calls"
            " BEGIN SELECT RAISE(ABORT, 'intent refused by the test'); END"
        )
        conn.commit()
        conversation, run = accepted(api, "call it")
        events = read_sse(api, conversation)
        assert events[-1].event == "chat-error" and events[-1].data["status"] == "failed", events[-1].data
        assert executions(env, "echo", text="three") == []  # not sent
        assert ledger_rows(env, conversation) == []
        assert get_json(api, f"/api/conversations/{conversation}")["resumable"] is True

        conn.execute("DROP TRIGGER test_refuse_intents")
        conn.commit()
    finally:
        conn.close()
    _, resumed = accepted(api, conversation=conversation, resume=True)
    events = read_sse(api, conversation)
    assert events[-1].data == {"conversation": conversation, "run": resumed, "status": "completed"}
    assert events.text == "Sent once."
    assert len(executions(env, "echo", text="three")) == 1
    assert [(r["state"], r["attempt"]) for r in ledger_rows(env, conversation)] == [("done", 1)]
    assert run != resumed
