"""The agent as an MCP server at /mcp (docs/agent-protocol.md, "The agent as an MCP server"),
driven by the real MCP client (``mcp``'s Streamable HTTP client and ``ClientSession``) against a
real API and worker with the fake model, on one stack for the module with two users: each
assistant a tool and another user's invisible, a call answered with the agent's answer and
continued on its thread, an approval, a failed run, a request without a key refused with 401,
the manual's client examples, and a worker killed with SIGKILL mid-call, whose run is answered
as cut short and resumed by calling again with its thread."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client

from tests.fakes.ollama import Drop, FakeOllama, Hang, Text, ToolCalls
from tests.support.client import wait_for, wait_for_async
from tests.support.http import async_http_client
from tests.support.stacks import Stack, own_redis_stack
from tests.support.users import add_user

#: submissions per minute from one address (the module's calls from 127.0.0.1 stay well below)
LIMIT = 30
DOC = Path(__file__).resolve().parent.parent / "docs" / "agent-protocol.md"


@dataclass
class People:
    stack: Stack
    alice: str
    bob: str
    #: Alice's assistant: its id
    helper: str

    @property
    def mcp(self) -> str:
        return f"{self.stack.api}/mcp"


@pytest.fixture(scope="module")
def people(tmp_path_factory: pytest.TempPathFactory, fake_ollama: FakeOllama) -> Iterator[People]:
    with own_redis_stack(
        tmp_path_factory.mktemp("mcp"), fake_ollama, approval=["add"], RATE_LIMIT_PER_MINUTE=str(LIMIT)
    ) as stack:
        with ThreadPoolExecutor(2) as pool:  # two CLI processes at once
            alice, bob = pool.map(lambda name: add_user(stack.env, name), ["alice", "bob"])
        # Keys are in force once a user exists: the API asks again within a second.
        wait_for(lambda: httpx.post(f"{stack.api}/mcp", json={}).status_code == 401, timeout=10,
                 message="keys in force")
        made = httpx.post(f"{stack.api}/assistants", headers={"authorization": f"Bearer {alice}"}, json={
            "graph_id": "agent", "name": "Alice's helper!", "description": "Answers Alice's questions",
            "context": {"system_prompt": "You help Alice."}}, timeout=30)
        assert made.status_code == 200, made.text
        yield People(stack, alice, bob, made.json()["assistant_id"])


def client_of(headers: dict[str, str]) -> httpx.AsyncClient:
    """An HTTP client as the manual's example makes it: a run may take a while to answer."""
    return async_http_client(headers=headers, timeout=httpx.Timeout(30, read=300))


@asynccontextmanager
async def session(url: str, key: str | None, **more: str) -> AsyncIterator[ClientSession]:
    headers = {**({"Authorization": f"Bearer {key}"} if key is not None else {}), **more}
    async with client_of(headers) as http, \
            streamable_http_client(url, http_client=http) as (read, write, _), \
            ClientSession(read, write) as client:
        await client.initialize()
        yield client


async def ask(method: str, url: str, key: str | None = None, **kwargs: Any) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key is not None else {}
    async with async_http_client(timeout=30) as http:
        return await http.request(method, url, headers={**headers, **kwargs.pop("headers", {})}, **kwargs)


def statuses(exc: BaseException) -> list[int]:
    """The HTTP statuses an exception (or the group the MCP client raises) carries."""
    if isinstance(exc, BaseExceptionGroup):
        return [s for e in exc.exceptions for s in statuses(e)]
    return [exc.response.status_code] if isinstance(exc, httpx.HTTPStatusError) else []


def text(result: types.CallToolResult) -> str:
    [block] = result.content
    assert isinstance(block, types.TextContent)
    return block.text


async def test_each_assistant_is_a_tool_and_another_users_is_not(people: People, model: FakeOllama) -> None:
    async with session(people.mcp, people.alice) as alice:
        tools = {t.name: t for t in (await alice.list_tools()).tools}
        offered = alice.get_server_capabilities()
    assert offered is not None and offered.tools is not None  # tools only
    assert offered.resources is None and offered.prompts is None
    assert set(tools) == {"agent", "Alice_s_helper"}
    helper = tools["Alice_s_helper"]
    assert helper.title == "Alice's helper!" and helper.description == "Answers Alice's questions"
    assert set(helper.inputSchema["properties"]) == {"message", "thread_id"}
    async with session(people.mcp, people.bob) as bob:
        assert [t.name for t in (await bob.list_tools()).tools] == ["agent"]
        # Alice's tool is no one's to call but hers: as unknown as a name nobody has.
        theirs = await bob.call_tool("Alice_s_helper", {"message": "hi"})
        nobody = await bob.call_tool("nobody_s", {"message": "hi"})
    assert theirs.isError and nobody.isError
    assert text(theirs).replace("Alice_s_helper", "X") == text(nobody).replace("nobody_s", "X")
    assert text(theirs).startswith("NOT_FOUND")
    assert not model.requests  # nothing ran


async def test_without_a_key_mcp_is_401(people: People) -> None:
    listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    accept = {"accept": "application/json, text/event-stream"}
    refused = await ask("POST", people.mcp, json=listing, headers=accept)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "UNAUTHORIZED"
    # With a key: answered, and statelessly (no session to come back to).
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": types.LATEST_PROTOCOL_VERSION, "capabilities": {},
        "clientInfo": {"name": "test", "version": "0"}}}
    opened = await ask("POST", people.mcp, people.bob, json=initialize, headers=accept)
    assert opened.status_code == 200 and "mcp-session-id" not in opened.headers
    wrong = await ask("POST", people.mcp, "sk-sophos-not-a-key", json=listing, headers=accept)
    assert wrong.status_code == 401 and wrong.json()["error"]["message"].startswith("the key is not valid")
    with pytest.raises(BaseExceptionGroup) as raised:  # the real client, without a key
        async with session(people.mcp, None):
            pass
    assert 401 in statuses(raised.value)


async def test_a_call_answers_with_the_agent_and_continues_its_thread(
    people: People, model: FakeOllama
) -> None:
    model.script(Text("Hello from Sophos."), Text("Still here."))
    async with session(people.mcp, people.alice) as alice:
        first = await alice.call_tool("Alice_s_helper", {"message": "hi"})
        assert not first.isError and text(first) == "Hello from Sophos."
        where = first.structuredContent
        assert where is not None and where["status"] == "completed"
        thread_id = where["thread_id"]
        again = await alice.call_tool("Alice_s_helper", {"message": "still there?", "thread_id": thread_id})
        assert text(again) == "Still here." and again.structuredContent is not None
        assert again.structuredContent["thread_id"] == thread_id != again.structuredContent["run_id"]
        assert again.structuredContent["run_id"] != where["run_id"]
        bad = await alice.call_tool("agent", {"message": ""})
        assert bad.isError and text(bad) == "BAD_REQUEST: message must be a non-empty string"
    # The run is a run like any other: Alice's, on a thread of hers, with the assistant's prompt.
    on = f"{people.stack.api}/threads/{thread_id}"
    thread = (await ask("GET", on, people.alice)).json()
    assert thread["metadata"]["owner"] == "alice"
    run = (await ask("GET", f"{on}/runs/{where['run_id']}", people.alice)).json()
    assert run["assistant_id"] == people.helper and run["status"] == "success"
    said = [m["content"] for m in thread["values"]["messages"]]
    assert said == ["hi", "Hello from Sophos.", "still there?", "Still here."]
    first = model.requests[0]["messages"][0]
    assert first["role"] == "system" and "You help Alice." in first["content"]
    # Bob cannot continue Alice's thread: it is as absent as a thread that does not exist.
    async with session(people.mcp, people.bob) as bob:
        hers = await bob.call_tool("agent", {"message": "mine now", "thread_id": thread_id})
        nowhere = await bob.call_tool("agent", {"message": "mine now", "thread_id": str(uuid.uuid4())})
    assert hers.isError and text(hers).startswith("NOT_FOUND")
    assert text(hers).replace(thread_id, "T") == re.sub(r"[0-9a-f-]{36}", "T", text(nowhere))
    assert len(model.requests) == 2


async def test_an_approval_and_a_failure_are_answered_as_such(people: People, model: FakeOllama) -> None:
    model.script(ToolCalls([("tools__add", {"a": 2, "b": 3})]), Drop())
    async with session(people.mcp, people.bob) as bob:
        waits = await bob.call_tool("agent", {"message": "add 2 and 3"})
        assert not waits.isError and waits.structuredContent is not None
        thread_id = waits.structuredContent["thread_id"]
        assert waits.structuredContent["status"] == "waiting"
        assert f"waits for approval of tools__add on thread {thread_id}" in text(waits)
        failed = await bob.call_tool("agent", {"message": "something else"})
    assert failed.isError and failed.structuredContent is not None
    assert failed.structuredContent["status"] == "failed" and text(failed).startswith("MODEL_")


async def test_the_manuals_client_examples(
    people: People, model: FakeOllama, capsys: pytest.CaptureFixture[str]
) -> None:
    section = DOC.read_text().split("## The agent as an MCP server: `/mcp`", 1)[1].split("\n## ", 1)[0]
    config = json.loads(re.search(r"```json\n(.*?)```", section, re.S).group(1))  # type: ignore[union-attr]
    server = config["mcpServers"]["sophos"]
    url = server["url"].replace("http://127.0.0.1:8000", people.stack.api)
    headers = {k: v.replace("YOUR_KEY", people.alice) for k, v in server["headers"].items()}
    model.script(Text("From the config."), Text("From the snippet."))
    async with client_of(headers) as http, \
            streamable_http_client(url, http_client=http) as (read, write, _), \
            ClientSession(read, write) as client:
        await client.initialize()
        assert text(await client.call_tool("agent", {"message": "hello"})) == "From the config."
    snippet = re.search(r"```python\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]
    snippet = snippet.replace("http://127.0.0.1:8000", people.stack.api).replace("YOUR_KEY", people.alice)
    scope: dict[str, Any] = {}
    exec("async def example():\n" + textwrap.indent(snippet, "    "), scope)  # noqa: S102 - the manual's code
    await scope["example"]()
    assert "From the snippet." in capsys.readouterr().out


async def test_a_worker_killed_mid_call_is_answered_then_resumed(people: People, model: FakeOllama) -> None:
    hang = Hang(text="half an ")
    model.script(hang, Text("answer, after the crash."))
    async with session(people.mcp, people.alice) as alice:
        call = asyncio.create_task(alice.call_tool("agent", {"message": "go"}))
        await hang.wait_started_async(20)
        people.stack.worker.kill()
        assert people.stack.worker.wait(10) == -signal.SIGKILL
        assert not call.done()  # the call waits across the crash, for a worker to find the run
        people.stack.worker = people.stack.group.start_worker(people.stack.env)
        cut = await asyncio.wait_for(call, 60)
        assert cut.isError and cut.structuredContent is not None
        thread_id = cut.structuredContent["thread_id"]
        assert cut.structuredContent["status"] == "interrupted"
        assert f"call agent again with thread_id {thread_id} and no message" in text(cut)
        resumed = await alice.call_tool("agent", {"thread_id": thread_id})
        assert not resumed.isError and text(resumed) == "answer, after the crash."
        again = await alice.call_tool("agent", {"thread_id": thread_id})  # nothing left to resume
        assert again.isError and text(again).startswith("RUN_NOT_RESUMABLE")
    thread = (await ask("GET", f"{people.stack.api}/threads/{thread_id}", people.alice)).json()
    assert [m["content"] for m in thread["values"]["messages"]] == ["go", "answer, after the crash."]


async def test_a_call_counts_against_the_submission_rate_limit(people: People, model: FakeOllama) -> None:
    # From an address of its own (127.0.0.1 is a trusted proxy): the module's other calls keep theirs.
    address = {"X-Forwarded-For": "192.0.2.77"}
    headers = {"authorization": f"Bearer {people.bob}", **address}
    async with async_http_client(timeout=30, headers=headers) as http:
        for _ in range(LIMIT + 1):  # every authenticated POST /api/chat counts, refused or not
            chat = await http.post(f"{people.stack.api}/api/chat", json={})
            if chat.status_code == 429:
                break
    assert chat.status_code == 429, chat.text
    async with session(people.mcp, people.bob, **address) as bob:
        refused = await bob.call_tool("agent", {"message": "one more"})
    assert refused.isError and text(refused).startswith("RATE_LIMITED: too many chat submissions")
    assert not model.requests


async def test_a_client_that_leaves_stops_its_wait_not_the_run(people: People, model: FakeOllama) -> None:
    hang = Hang(text="slow ", then=Text("answer nobody waited for."))
    model.script(hang, Text("Second answer."))

    async def call() -> None:
        async with session(people.mcp, people.bob) as bob:
            await bob.call_tool("agent", {"message": "take your time"})

    task = asyncio.create_task(call())
    await hang.wait_started_async(20)
    runs = f"{people.stack.api}/api/runs"
    [run] = (await ask("GET", runs, people.bob, params={"status": "running"})).json()["runs"]
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    api = next(p for p in people.stack.group.processes if p.module == "api" and p.alive)
    # The API stopped waiting for the run (its relay closed) while the run goes on.
    await asyncio.to_thread(
        wait_for, lambda: any(r.get("event") == "relay.closed" and r.get("run_id") == run["id"]
                              for r in api.log_records()), 20, message="the call's wait closed")
    async with session(people.mcp, people.bob) as bob:
        # A call on the busy thread waits its turn (enqueue), then answers.
        on = run["conversation"]
        behind = asyncio.create_task(bob.call_tool("agent", {"message": "and then?", "thread_id": on}))

        async def waiting() -> bool:
            listed = (await ask("GET", f"{people.stack.api}/threads/{on}/runs", people.bob)).json()
            return [r["status"] for r in listed] == ["pending", "running"]

        await wait_for_async(waiting, timeout=20, message="the call's run waiting behind the first")
        hang.release()
        assert text(await asyncio.wait_for(behind, 30)) == "Second answer."

    async def completed() -> bool:
        return bool((await ask("GET", f"{runs}/{run['id']}", people.bob)).json()["status"] == "completed")

    await wait_for_async(completed, timeout=20, message="the run's end")


def test_an_api_process_loads_mcps_server_side_only_when_asked() -> None:
    """api/protocol/mcp_mount.py: the ``mcp`` package is imported by the first request to /mcp,
    not by an API process starting (its import costs about 0.3 s of CPU and 13 MB)."""
    loaded_by_app = "import sys, api.app; print(sorted(m for m in sys.modules if m.split('.')[0] == 'mcp'))"
    loaded = subprocess.run(
        [sys.executable, "-c", loaded_by_app],
        capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[1],
    ).stdout.strip()
    assert loaded == "[]"
