"""Issue 42, part 2: long tool calls as MCP tasks, across a worker's kill -9 and a cancel.

The task server (tests/fakes/task_server.py: one tool, ``long``, which may run as a task; its task
ids are the server's, not a session's) runs twice: as a remote server over Streamable HTTP in a
process of its own on loopback, which outlives the worker (``far``), and as the worker's stdio
child, which dies with it (``near``). Neither says its tool is safe to repeat.

- a call made as a task completes; the ledger and the detail show its task id and state;
- the worker killed (-9) while both run: the resume asks ``far`` for its task and continues with
  the task's result, the tool having run once and no question asked (counted in ``/metrics``);
  ``near``'s new child does not know its task: that call is uncertain and asked about;
- cancelling a run cancels its task on the server: the tool stops, never finishing;
- a task whose server went away while it was followed is an unanswered call (uncertain), never a
  plain error the model would retry as a second task (no worker: the session alone).

Per engine one API, one remote task server and a worker (one more for the kill).
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.tools import ToolException

from tests.fakes.ollama import FakeOllama, Text, ToolCalls
from tests.support.client import get_json, read_sse, tool_calls, wait_for
from tests.support.env import TASK_SERVER, SophosEnv
from tests.support.faults import (
    accepted,
    asked_calls,
    call_counters,
    decide,
    ledger_rows,
    recorded_after_crash,
)
from tests.support.http import http_client
from tests.support.redis_server import RedisServer
from tests.support.tool_servers import RemoteTools, server_alone, task_endings
from tests.support.tool_stacks import ToolStack, tool_stack
from worker.tools.ledger.attempt import sending
from worker.tools.mcp import McpServer

pytestmark = [pytest.mark.fault]

FROM_TASK = "sophos_tool_calls_answered_from_task_total"


def _servers(env: SophosEnv, far: RemoteTools) -> dict[str, Any]:
    return {"far": {"url": far.url},
            "near": {"command": sys.executable, "args": [str(TASK_SERVER)],
                     "env": {"TOOLS_LOG": str(env.tools_log)}}}


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def tasks(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer,
    fake_ollama: FakeOllama,
) -> Iterator[ToolStack]:
    root = tmp_path_factory.mktemp(f"tasks-{request.param}")
    with tool_stack(request, root, redis_server.url, fake_ollama.url, _servers, script=TASK_SERVER) as stack:
        yield stack


def _calls(env: SophosEnv, remote: bool) -> list[dict[str, Any]]:
    return [e for e in tool_calls(env.tools_log, "long") if bool(e.get("remote")) == remote]


def _tasks_of(env: SophosEnv, conversation: str) -> dict[str, dict[str, Any]]:
    """The conversation's ledger rows by tool, once every call has its task id."""
    return {r["tool"]: r for r in ledger_rows(env, conversation) if r["task_id"] is not None}


def test_a_call_made_as_a_task_completes_and_the_ledger_and_the_detail_show_its_task(
    tasks: ToolStack, model: FakeOllama,
) -> None:
    model.script(ToolCalls([("far__long", {"seconds": 0.3, "text": "quick"})]), Text("quick done"))
    conversation, _ = accepted(tasks.api, "a short task")
    events = read_sse(tasks.api, conversation)
    assert events[-1].data["status"] == "completed" and events.text == "quick done"
    [row] = ledger_rows(tasks.env, conversation)
    [ran] = [e for e in _calls(tasks.env, remote=True) if e["args"]["text"] == "quick"]
    assert (row["task_id"], row["task_state"], row["state"], row["key"]) == (ran["task"], "completed", "done",
                                                                             ran["key"])
    detail = get_json(tasks.api, f"/api/conversations/{conversation}")
    [call] = [c for m in detail["messages"] for c in m.get("toolCalls", [])]
    assert call["ledger"]["task"] == {"id": ran["task"], "state": "completed"}
    assert [m["content"] for m in detail["messages"] if m["role"] == "tool"] == ["done: quick"]


def test_a_worker_killed_mid_task_resumes_from_the_task_and_a_forgotten_task_is_asked_about(
    tasks: ToolStack, model: FakeOllama,
) -> None:
    api, env = tasks.api, tasks.env
    model.script(ToolCalls([("far__long", {"seconds": 1.5, "text": "far"}),
                            ("near__long", {"seconds": 1.5, "text": "near"})]), Text("both answered"))
    conversation, run = accepted(api, "two long tasks")
    made = wait_for(lambda: len(t := _tasks_of(env, conversation)) == 2 and t, timeout=30,
                    message="both calls made as tasks, their ids in the ledger")
    assert tasks.worker is not None
    tasks.worker.kill()
    assert tasks.worker.wait(30) == -signal.SIGKILL
    tasks.worker = tasks.group.start_worker(env)  # the module's: the next test runs on it
    counted = call_counters(api)
    assert recorded_after_crash(api, run)["status"] == "interrupted"
    plan = {p["name"]: p["action"] for p in get_json(api, f"/api/conversations/{conversation}")["resumePlan"]}
    assert plan == {"far__long": "task", "near__long": "task"}

    accepted(api, conversation=conversation, resume=True)
    asked = asked_calls(read_sse(api, conversation))
    # far's task was asked for and answered; near's stdio server died with the worker and its new
    # one does not know the task: that call may have run, and the user is asked.
    assert {n: r["kind"] for n, r in asked.items()} == {"near__long": "uncertain"}
    rows = {r["tool"]: r for r in ledger_rows(env, conversation)}
    far, near = rows["far__long"], rows["near__long"]
    assert (far["state"], far["status"], far["attempt"]) == ("done", "success", 1)
    assert far["result"] == '"done: far"'
    assert far["task_id"] == made["far__long"]["task_id"] and far["task_state"] == "completed"
    assert (near["state"], near["task_state"]) == ("intent", "forgotten")
    assert (call_counters(api) - counted)[FROM_TASK] == 1
    # The remote tool ran once, its task to the end; nothing was sent again.
    assert [e["args"]["text"] for e in _calls(env, remote=True)].count("far") == 1
    assert task_endings(env.tools_log, far["task_id"]) == ["done"]
    assert [e["args"]["text"] for e in _calls(env, remote=False)].count("near") == 1

    events = decide(api, conversation, [{"id": asked["near__long"]["id"], "action": "reject"}])
    assert events[-1].data["status"] == "completed" and events.text == "both answered"
    told = {m["name"]: m["content"] for m in get_json(api, f"/api/conversations/{conversation}")["messages"]
            if m["role"] == "tool"}
    assert told["far__long"] == "done: far" and "may or may not have taken effect" in told["near__long"]


def test_cancelling_a_run_cancels_its_task_on_the_server(tasks: ToolStack, model: FakeOllama) -> None:
    api, env = tasks.api, tasks.env
    model.script(ToolCalls([("far__long", {"seconds": 20, "text": "cancel me"})]), Text("never"))
    conversation, run = accepted(api, "a task to cancel")
    task_id = wait_for(lambda: (t := _tasks_of(env, conversation)) and t["far__long"]["task_id"], timeout=30,
                       message="the call made as a task")
    with http_client(base_url=api, timeout=10) as http:
        assert http.post(f"/api/runs/{run}/cancel").status_code == 202
    assert read_sse(api, conversation)[-1].data["status"] == "cancelled"
    wait_for(lambda: task_endings(env.tools_log, task_id) == ["cancelled"], timeout=10,
             message="the task cancelled on its server")
    wait_for(lambda: [(r["state"], r["task_state"]) for r in ledger_rows(env, conversation)]
             == [("intent", "cancelled")], timeout=10, message="the task's state recorded")


async def test_a_task_whose_server_went_away_while_it_was_followed_is_unanswered(tmp_path: Path) -> None:
    with server_alone(tmp_path, script=TASK_SERVER) as server:
        far = McpServer("far", {"transport": "streamable_http", "url": server.url}, start_timeout=10,
                        call_timeout=2)
        states: list[tuple[str, str]] = []

        async def on_task(task_id: str, state: str) -> None:
            states.append((task_id, state))

        try:
            assert await far.open()
            with sending("key-lost", on_task) as attempt:
                call = asyncio.create_task(far.call("long", {"seconds": 30, "text": "lost"}, task=True))
                await asyncio.to_thread(wait_for, lambda: states, timeout=10, message="the task made")
                server.stop()
                with pytest.raises(ToolException):
                    await call
            assert attempt.unanswered is not None and "task" in attempt.unanswered
            assert [s for _, s in states] == ["working"]
            assert [e["task"] for e in _calls(server.env, remote=True)] == [states[0][0]]
        finally:
            await far.shutdown()
