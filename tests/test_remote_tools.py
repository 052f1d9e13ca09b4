"""Issue 42, parts 1 and 3: a remote tools server, and calls whose answer did not come.

The remote server is the fake tools server over Streamable HTTP (tests/fakes/tools_server.py
``--http``) in a process of its own on loopback, behind a bearer token the worker reads from
``${REMOTE_TOOLS_TOKEN}``; it outlives the worker's kill -9. Beside it the same tools over stdio.
``slow`` and ``vanish`` are taken as calls that act (``safeToRepeat``), so a call of them that may
have run is put to a person.

- a remote call completes, its key in ``_meta``, timed like a stdio one, and its token appears in
  no log, no page, no status;
- calls that timed out (``MCP_CALL_TIMEOUT``), and calls whose server died mid-call (the stdio pipe
  closed; the remote server gone, its connection reset), stdio and remote alike, are uncertain:
  the run asks, the model never gets a plain error to retry under a new key;
- the worker killed while a remote call runs: the resume asks, and approval sends it again with the
  same key.

Cheap by design: per engine one API, one remote server, a worker shared by the first cases and one
more for the kill.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.ollama import FakeOllama, Text, ToolCalls
from tests.support.client import get_json, read_sse, tool_calls, tool_log, wait_for
from tests.support.env import SophosEnv, stdio_tools
from tests.support.faults import (
    accepted,
    asked_calls,
    call_counters,
    decide,
    ledger_rows,
    recorded_after_crash,
)
from tests.support.http import http_client
from tests.support.procs import ServiceProcess
from tests.support.redis_server import RedisServer
from tests.support.tool_servers import RemoteTools, server_alone
from tests.support.tool_stacks import ToolStack, tool_stack
from worker.tools.config import load_config
from worker.tools.ledger.attempt import sending
from worker.tools.mcp import McpServer

pytestmark = [pytest.mark.fault]

#: the remote server's bearer token: it must appear nowhere the worker writes
SECRET = "remote-token-5f3a91c7e2"
CALL_TIMEOUT = 3
ACTS = {"slow": False, "vanish": False}  # safeToRepeat: calls of these act


def _servers(env: SophosEnv, remote: RemoteTools) -> dict[str, Any]:
    return {
        "tools": {**stdio_tools(env), "safeToRepeat": ACTS},
        "remote": {"url": remote.url, "headers": {"Authorization": "Bearer ${REMOTE_TOOLS_TOKEN}"},
                   "safeToRepeat": ACTS},
    }


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def remote(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer,
    fake_ollama: FakeOllama,
) -> Iterator[ToolStack]:
    root = tmp_path_factory.mktemp(f"remote-{request.param}")
    with tool_stack(request, root, redis_server.url, fake_ollama.url, _servers, token=SECRET,
                    MCP_CALL_TIMEOUT=CALL_TIMEOUT, REMOTE_TOOLS_TOKEN=SECRET) as stack:
        yield stack


def _remote_runs(env: SophosEnv, tool: str) -> list[dict[str, Any]]:
    return [e for e in tool_calls(env.tools_log, tool) if e.get("remote")]


def test_a_remote_call_completes_with_its_key_and_its_token_is_written_nowhere(
    remote: ToolStack, model: FakeOllama,
) -> None:
    api = remote.api
    ready = get_json(api, "/api/readyz")
    assert ready["checks"]["toolServers"]["remote"] == "up"
    model.script(ToolCalls([("remote__echo", {"text": "far away"}), ("remote__add", {"a": 2, "b": 3})]),
                 Text("remote done"))
    conversation, _ = accepted(api, "call the remote tools")
    events = read_sse(api, conversation)
    assert events[-1].data["status"] == "completed" and events.text == "remote done"
    detail = get_json(api, f"/api/conversations/{conversation}")
    results = {m["name"]: m["content"] for m in detail["messages"] if m["role"] == "tool"}
    assert results == {"remote__echo": "far away", "remote__add": "5"}
    # Each ran once, on the remote server, with its call's key (the ledger's) in ``_meta``.
    rows = {r["tool"]: r for r in ledger_rows(remote.env, conversation)}
    assert {t: [e["key"] for e in _remote_runs(remote.env, t.removeprefix("remote__"))] for t in rows} == {
        t: [r["key"]] for t, r in rows.items()
    }
    # Timed like a stdio server's calls.
    with http_client(base_url=api, timeout=10) as http:
        metrics = http.get("/metrics").text
    assert 'tool="remote__echo"' in metrics
    # The token: in no log, no page, no status (it is in the worker's environment only).
    pages = [
        httpx.get(f"{api}{path}", timeout=10, trust_env=False).text
        for path in (f"/api/conversations/{conversation}", f"/api/conversations/{conversation}/export",
                     "/api/readyz", "/metrics", "/api/agent")
    ]
    assert SECRET not in remote.logs() and not any(SECRET in page for page in pages)


def test_calls_whose_answer_did_not_come_are_uncertain_for_stdio_and_remote_servers_alike(
    remote: ToolStack, model: FakeOllama,
) -> None:
    api, env = remote.api, remote.env
    # Timed out: both calls outlast MCP_CALL_TIMEOUT.
    model.script(ToolCalls([("remote__slow", {"seconds": 8}), ("tools__slow", {"seconds": 8})]),
                 Text("noted"))
    conversation, _ = accepted(api, "two calls that will not answer in time")
    asked = asked_calls(read_sse(api, conversation))
    assert {n: (r["kind"], r["attempts"]) for n, r in asked.items()} == {
        "remote__slow": ("uncertain", 1), "tools__slow": ("uncertain", 1),
    }
    # The model was told nothing yet: no tool message, no second call under a new id.
    detail = get_json(api, f"/api/conversations/{conversation}")
    assert not [m for m in detail["messages"] if m["role"] == "tool"] and model.calls == 1
    events = decide(api, conversation, [{"id": r["id"], "action": "reject"} for r in asked.values()])
    assert events[-1].data["status"] == "completed"
    told = [m for m in get_json(api, f"/api/conversations/{conversation}")["messages"] if m["role"] == "tool"]
    assert len(told) == 2 and all("may or may not have taken effect" in m["content"] for m in told)
    assert len(_remote_runs(env, "slow")) == 1
    assert len([e for e in tool_calls(env.tools_log, "slow") if not e.get("remote")]) == 1

    # Died mid-call: the stdio server exits (its pipe closes), the remote one too (its connection
    # is cut; noticed within MCP_CALL_TIMEOUT, mcp's HTTP client dropping a cut stream silently).
    model.script(ToolCalls([("tools__vanish", {}), ("remote__vanish", {})]), Text("gone, noted"))
    accepted(api, "two servers that die mid-call", conversation)
    asked = asked_calls(read_sse(api, conversation))
    assert {n: r["kind"] for n, r in asked.items()} == {
        "tools__vanish": "uncertain", "remote__vanish": "uncertain",
    }
    rows = {r["tool"]: r for r in ledger_rows(env, conversation)}
    assert (rows["tools__vanish"]["state"], rows["remote__vanish"]["state"]) == ("intent", "intent")
    remote.server.stop()
    remote.server.start()  # the same address: the worker reconnects on its own
    events = decide(api, conversation, [{"id": r["id"], "action": "reject"} for r in asked.values()])
    assert events[-1].data["status"] == "completed"
    assert len(tool_calls(env.tools_log, "vanish")) == 2  # each sent once, never again

    # Reconnected: the next remote call is answered.
    model.script(ToolCalls([("remote__echo", {"text": "back"})]), Text("back"))
    accepted(api, "and now?", conversation)
    wait_for(lambda: read_sse(api, conversation)[-1].data["status"] == "completed", timeout=30,
             message="the remote call answered after the server came back")
    assert _remote_runs(env, "echo")[-1]["args"] == {"text": "back"}


def test_a_worker_killed_while_a_remote_call_runs_is_asked_about_and_sent_again_with_its_key(
    remote: ToolStack, model: FakeOllama, start_worker: Callable[..., ServiceProcess],
) -> None:
    api, env = remote.api, remote.env
    before = len(_remote_runs(env, "slow"))
    model.script(ToolCalls([("remote__slow", {"seconds": 1.5})]), Text("slept far away"))
    conversation, run = accepted(api, "a long remote call")
    wait_for(lambda: any(r["tool"] == "remote__slow" for r in ledger_rows(env, conversation))
             and len(_remote_runs(env, "slow")) == before + 1, timeout=30, message="the remote call running")
    assert remote.worker is not None
    remote.worker.kill()
    assert remote.worker.wait(30) == -signal.SIGKILL
    survivor = start_worker(env)
    counted = call_counters(api)
    assert recorded_after_crash(api, run)["status"] == "interrupted"
    # The remote server outlived the worker and finished the call.
    key = _remote_runs(env, "slow")[before]["key"]
    assert [r["key"] for r in ledger_rows(env, conversation)] == [key]
    server_pid = _remote_runs(env, "slow")[before]["pid"]
    wait_for(lambda: any(e.get("event") == "done" and e.get("pid") == server_pid
                         for e in tool_log(env.tools_log)),
             timeout=10, message="the remote call finished on its server")

    accepted(api, conversation=conversation, resume=True)
    asked = asked_calls(read_sse(api, conversation))
    assert asked["remote__slow"]["kind"] == "uncertain" and len(_remote_runs(env, "slow")) == before + 1
    events = decide(api, conversation, [{"id": asked["remote__slow"]["id"], "action": "approve"}])
    assert events[-1].data["status"] == "completed" and events.text == "slept far away"
    [row] = [r for r in ledger_rows(env, conversation) if r["tool"] == "remote__slow"]
    ran = [e["key"] for e in _remote_runs(env, "slow")[before:]]
    assert ran == [key, key] and (row["key"], row["state"], row["attempt"]) == (key, "done", 2)
    assert (call_counters(api) - counted)["sophos_tool_calls_repeated_total:decided"] == 1
    assert SECRET not in remote.logs() and SECRET not in survivor.log_text()
    remote.worker = survivor


async def test_the_older_sse_transport_is_spoken_too(tmp_path: Path) -> None:
    """``"transport": "sse"``: the same tools, the token sent, the key in ``_meta`` (no worker: the
    session alone, against the server in its own process)."""
    with server_alone(tmp_path, "--sse", token=SECRET) as server:
        path = tmp_path / "mcp.json"
        path.write_text(json.dumps({"mcpServers": {"old": {
            "url": f"http://127.0.0.1:{server.port}/sse", "transport": "sse",
            "headers": {"Authorization": "Bearer ${TOKEN}"},
        }}}))
        for token, up in (("wrong", False), (SECRET, True)):
            connection = load_config(path, {"TOKEN": token})["old"]
            old = McpServer("old", connection, start_timeout=10, call_timeout=10)
            try:
                assert await old.open() is up
                if up:
                    with sending("key-sse"):
                        assert await old.call("echo", {"text": "over sse"}) == "over sse"
                else:
                    assert "401" in (old.error or "") and token not in (old.error or "")
            finally:
                await old.shutdown()
        assert tool_calls(server.env.tools_log, "echo") == [
            {"tool": "echo", "args": {"text": "over sse"}, "pid": server.process.pid,  # type: ignore[union-attr]
             "key": "key-sse", "remote": True},
        ]


async def test_a_server_that_restarted_and_forgot_the_session_gets_the_refused_call_once_more(
    tmp_path: Path,
) -> None:
    """A Streamable HTTP server restarted between two calls answers 404 for the old session: that
    request never ran, so it goes once more on a new session, and runs once (no worker: the
    session alone)."""
    with server_alone(tmp_path, token=SECRET) as server:
        path = tmp_path / "mcp.json"
        path.write_text(json.dumps({"mcpServers": {"far": {
            "url": server.url, "headers": {"Authorization": "Bearer ${TOKEN}"},
        }}}))
        far = McpServer("far", load_config(path, {"TOKEN": SECRET})["far"], start_timeout=10, call_timeout=10)
        try:
            assert await far.open()
            first = far.session
            server.stop()
            server.start()
            with sending("key-after-restart") as attempt:
                assert await far.call("echo", {"text": "again"}) == "again"
            assert attempt.unanswered is None and far.session is not first
        finally:
            await far.shutdown()
        assert [(e["args"], e["key"]) for e in tool_calls(server.env.tools_log, "echo")] == [
            ({"text": "again"}, "key-after-restart"),
        ]
