"""Tool calls and their effects (issue 29, parts 2, 3 and 7): each call's key and ledger row, and
a call whose intent is refused. The kills at each point of a call, the calls that may have run
put to a person or sent again, are tests/test_kill_points.py.

Real worker, API, Redis and database (SQLite file, or PostgreSQL where marked
``backends``); the fake tools server logs each execution with the idempotency key it
received in the request's ``_meta`` (tests/fakes/tools_server.py), so executions are
counted per key across worker processes.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from typing import Any

import pytest

from tests.fakes.ollama import FakeOllama, Text, ToolCalls
from tests.support.client import get_json, read_sse, tool_calls, wait_for
from tests.support.env import SophosEnv, mcp_servers, not_safe_to_repeat
from tests.support.faults import accepted, ledger_rows
from tests.support.http import http_client

pytestmark = [pytest.mark.fault, pytest.mark.backends]

FAST = ("tools__echo", {"text": "three"})


@pytest.fixture
def env(sophos_env: SophosEnv) -> SophosEnv:
    """Only the fake tools server (the fetch server would cost each worker start)."""
    tools = mcp_servers(sophos_env.tools_log, sophos_env.root)["mcpServers"]["tools"]
    # Taken as tools that act: a call that may have run is asked about (safeToRepeat: false).
    sophos_env.write_mcp_config(not_safe_to_repeat({"mcpServers": {"tools": tools}}))
    return sophos_env


def executions(env: SophosEnv, tool: str, **args: Any) -> list[str | None]:
    """The keys the tools server received for each execution of ``tool`` with ``args``."""
    return [e.get("key") for e in tool_calls(env.tools_log, tool) if e["args"] == args]


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
    with http_client(base_url=api, timeout=15) as http:
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
