"""The fakes and the fixtures, checked against the real clients that will use them.

These prove that FakeOllama speaks the protocol ChatOllama expects, that the fake
MCP tools server and mcp-server-fetch work through langchain-mcp-adapters, and
that the Redis and process helpers do what the service tests rely on.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import ClassVar

import httpx
import ollama
import pytest
import readabilipy
from langchain_core.messages import AIMessageChunk, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_mcp_adapters.client import MultiServerMCPClient
from langchain_mcp_adapters.sessions import StdioConnection
from langchain_mcp_adapters.tools import load_mcp_tools
from langchain_ollama import ChatOllama
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from tests.fakes.ollama import Drop, FakeOllama, Hang, Status, StreamError, Text, ToolCalls, split_tokens
from tests.support.client import (
    SseDropped,
    SseError,
    SseTimeout,
    read_sse,
    read_sse_async,
    tool_calls,
    tool_log,
    wait_for,
    wait_for_async,
)
from tests.support.env import TOOLS_SERVER, SophosEnv, with_fetch
from tests.support.http import http_client
from tests.support.loopback import serving
from tests.support.procs import ProcessGroup, ProcessStartError, pid_alive
from tests.support.redis_server import RedisServer

# --- FakeOllama with the real ChatOllama ----------------------------------------------------


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def chat(fake: FakeOllama, model: str = "test-model") -> ChatOllama:
    return ChatOllama(base_url=fake.url, model=model)


def test_split_tokens_keeps_the_text() -> None:
    for text in ["", "one", "Hello, world!", "  lead and trail  ", "a\n\nb\tc ", "üñí çødé 🙂"]:
        pieces = split_tokens(text)
        assert "".join(pieces) == text
        assert all(pieces)
    assert split_tokens("Hello there, world") == ["Hello ", "there, ", "world"]


async def test_text_reply_and_recorded_request(model: FakeOllama) -> None:
    model.script(Text("Hello there, world!\n  Bye."))
    reply = await chat(model).ainvoke([SystemMessage("You are a test."), HumanMessage("hi")])
    assert reply.content == "Hello there, world!\n  Bye."
    assert reply.response_metadata["done_reason"] == "stop"
    assert reply.usage_metadata is not None and reply.usage_metadata["output_tokens"] == 4
    (request,) = model.requests
    assert request["model"] == "test-model"
    assert request["stream"] is True
    assert request["messages"] == [
        {"role": "system", "content": "You are a test."},
        {"role": "user", "content": "hi"},
    ]
    assert model.calls == 1 and model.pending == 0


async def test_astream_yields_one_chunk_per_token(model: FakeOllama) -> None:
    text = "one two three four"
    model.script(Text(text))
    chunks = [c async for c in chat(model).astream("count")]
    pieces = [c.content for c in chunks if c.content]
    assert pieces == split_tokens(text)


async def test_tokens_are_flushed_one_line_at_a_time(model: FakeOllama) -> None:
    # The client gets the first pieces while the server still holds the response.
    hang = Hang(text="early words ", then=Text("late"))
    model.script(hang)
    seen: list[str] = []

    async def consume() -> None:
        async for chunk in chat(model).astream("x"):
            if chunk.content:
                seen.append(str(chunk.content))

    task = asyncio.create_task(consume())
    await hang.wait_started_async()
    await wait_for_async(
        lambda: seen == ["early ", "words "], timeout=5, message=lambda: f"tokens, got {seen}"
    )
    assert not task.done()
    hang.release()
    await asyncio.wait_for(task, 5)
    assert "".join(seen) == "early words late"


async def test_tool_calls_reach_bind_tools(model: FakeOllama) -> None:
    model.script(ToolCalls([("add", {"a": 1, "b": 2}), ("tools__echo", {"text": "x"})], text="Let me add."))
    reply = await chat(model).bind_tools([add]).ainvoke("1+2?")
    assert reply.content == "Let me add."
    assert [(c["name"], c["args"]) for c in reply.tool_calls] == [
        ("add", {"a": 1, "b": 2}),
        ("tools__echo", {"text": "x"}),
    ]
    assert all(c["id"] for c in reply.tool_calls)  # made up client-side
    (request,) = model.requests
    assert [t["function"]["name"] for t in request["tools"]] == ["add"]


async def test_tool_calls_in_astream(model: FakeOllama) -> None:
    model.script(ToolCalls([("tools__add", {"a": 2, "b": 3})]))
    merged: AIMessageChunk | None = None
    async for chunk in chat(model).bind_tools([add]).astream("2+3?"):
        assert isinstance(chunk, AIMessageChunk)
        merged = chunk if merged is None else merged + chunk
    assert merged is not None
    assert [(c["name"], c["args"]) for c in merged.tool_calls] == [("tools__add", {"a": 2, "b": 3})]


async def test_script_order_then_default_text(model: FakeOllama) -> None:
    model.script(Text("first"), Text("second"))
    llm = chat(model)
    assert (await llm.ainvoke("a")).content == "first"
    assert (await llm.ainvoke("b")).content == "second"
    assert (await llm.ainvoke("c")).content == "ok"
    model.default_text = "fallback"
    assert (await llm.ainvoke("d")).content == "fallback"
    assert [r["messages"][-1]["content"] for r in model.wait_for_calls(4, timeout=1)] == ["a", "b", "c", "d"]
    model.reset()
    assert model.calls == 0 and model.requests == [] and model.pending == 0


async def test_unknown_model_is_404_and_consumes_nothing(model: FakeOllama) -> None:
    model.script(Text("kept"))
    with pytest.raises(ollama.ResponseError) as info:
        await chat(model, "no-such-model").ainvoke("x")
    assert info.value.status_code == 404
    assert info.value.error == "model 'no-such-model' not found"
    assert model.pending == 1 and model.calls == 1
    assert (await chat(model, "test-model:latest").ainvoke("x")).content == "kept"


async def test_refused_connection_is_httpx_connect_error(model: FakeOllama) -> None:
    with FakeOllama() as gone:
        url = gone.url
    with pytest.raises(httpx.ConnectError):
        await ChatOllama(base_url=url, model="test-model").ainvoke("x")


async def test_failure_replies(model: FakeOllama) -> None:
    llm = chat(model)
    model.script(Status(500, {"error": "out of memory"}))
    with pytest.raises(ollama.ResponseError) as info:
        await llm.ainvoke("x")
    assert (info.value.status_code, info.value.error) == (500, "out of memory")

    model.script(StreamError("model crashed", after_tokens=1))
    with pytest.raises(ollama.ResponseError, match="model crashed"):
        await llm.ainvoke("x")

    model.script(Drop(after_tokens=2))
    with pytest.raises(httpx.RemoteProtocolError):
        await llm.ainvoke("x")
    assert model.calls == 3


async def test_hang_ends_on_release_reset_or_client_leaving(model: FakeOllama) -> None:
    llm = chat(model)

    released = Hang(text="partial ")
    model.script(released)
    task = asyncio.create_task(llm.ainvoke("x"))
    await released.wait_started_async()
    released.release()
    assert (await asyncio.wait_for(task, 5)).content == "partial "

    abandoned = Hang()
    model.script(abandoned)
    task = asyncio.create_task(llm.ainvoke("x"))
    await abandoned.wait_started_async()
    task.cancel()
    await asyncio.to_thread(abandoned.wait_client_gone, 5)
    assert abandoned.finished.wait(5)

    cut = Hang()
    model.script(cut)
    task = asyncio.create_task(llm.ainvoke("x"))
    await cut.wait_started_async()
    model.reset()
    with pytest.raises(httpx.RemoteProtocolError):
        await asyncio.wait_for(task, 5)


def test_tags_and_other_endpoints(model: FakeOllama) -> None:
    with http_client(base_url=model.url) as http:
        tags = http.get("/api/tags").json()
        assert [m["name"] for m in tags["models"]] == ["test-model:latest"]
        assert tags["models"][0]["model"] == "test-model:latest"
        assert http.get("/").text == "Ollama is running"
        assert http.post("/api/show", json={"model": "test-model"}).status_code == 200
        assert http.post("/api/show", json={"model": "other"}).status_code == 404
    client = ollama.Client(host=model.url)
    assert [m.model for m in client.list().models] == ["test-model:latest"]


def test_restart_on_the_same_port() -> None:
    fake = FakeOllama(["a", "b:7b"]).start()
    url = fake.url
    fake.close()  # the model goes away: clients get ConnectError
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/api/tags", trust_env=False)
    fake.start()  # and comes back where it was
    try:
        assert fake.url == url
        assert httpx.get(f"{url}/api/tags", trust_env=False).status_code == 200
    finally:
        fake.close()
    with FakeOllama(["a"], port=fake.port) as again:
        assert again.url == url
        assert again.knows("a:latest") and not again.knows("b:7b")


# --- MCP: the fake tools server and mcp-server-fetch -----------------------------------------


async def test_tools_server_over_stdio(tmp_path: Path) -> None:
    log = tmp_path / "tools.log"
    client = MultiServerMCPClient(
        {
            "t": {
                "command": sys.executable,
                "args": [str(TOOLS_SERVER)],
                "transport": "stdio",
                "env": {"TOOLS_LOG": str(log)},
            }
        }
    )
    async with client.session("t") as session:
        tools = {t.name: t for t in await load_mcp_tools(session)}
        assert sorted(tools) == ["add", "echo", "fail", "slow", "vanish"]
        # Results come back as content blocks, not plain strings.
        assert (await tools["echo"].ainvoke({"text": "héllo"}))[0]["text"] == "héllo"
        assert (await tools["add"].ainvoke({"a": 2, "b": 40}))[0]["text"] == "42"
        assert (await tools["slow"].ainvoke({"seconds": 0.05}))[0]["text"] == "slept 0.05s"
        failed = await tools["fail"].ainvoke(
            {"type": "tool_call", "id": "call-1", "name": "fail", "args": {"message": "nope"}}
        )
        assert isinstance(failed, ToolMessage)
        assert failed.status == "error"
        assert "nope" in str(failed.content)

    entries = tool_log(log)
    pids = {e["pid"] for e in entries}
    assert len(pids) == 1
    assert [(e["tool"], e.get("args"), e.get("event")) for e in entries] == [
        ("echo", {"text": "héllo"}, None),
        ("add", {"a": 2, "b": 40}, None),
        ("slow", {"seconds": 0.05}, None),
        ("slow", None, "done"),
        ("fail", {"message": "nope"}, None),
    ]
    assert [e["tool"] for e in tool_calls(log)] == ["echo", "add", "slow", "fail"]
    # Each execution logs the idempotency key it was sent in `_meta` (none through the adapters).
    slow = {"tool": "slow", "args": {"seconds": 0.05}, "pid": pids.pop(), "key": None}
    assert tool_calls(log, "slow") == [slow]


def _exchange(tmp_path: Path, *options: str) -> list[dict[str, object]]:
    """One session with the fake tools server over stdio, as MCP's client speaks it: its answers,
    in the order they came (a slow call is answered after a quick one sent behind it, and a
    cancelled call is answered as cancelled)."""
    import subprocess

    log = tmp_path / f"tools{len(options)}.log"
    process = subprocess.Popen(
        [sys.executable, str(TOOLS_SERVER), *options], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, env={"TOOLS_LOG": str(log)}, text=True,
    )
    assert process.stdin is not None and process.stdout is not None
    stdin, stdout = process.stdin, process.stdout

    def send(message: dict[str, object]) -> None:
        stdin.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
        stdin.flush()

    def answer() -> dict[str, object]:
        return dict(json.loads(stdout.readline()))

    def call(number: int, name: str, arguments: dict[str, object]) -> None:
        params = {"name": name, "arguments": arguments, "_meta": {"sophos/idempotency-key": f"key-{number}"}}
        send({"id": number, "method": "tools/call", "params": params})

    def initialize(number: int, version: str) -> None:
        client = {"name": "t", "version": "1"}
        send({"id": number, "method": "initialize",
              "params": {"protocolVersion": version, "capabilities": {}, "clientInfo": client}})

    answers = []
    try:
        initialize(1, "2025-06-18")
        answers.append(answer())
        send({"method": "notifications/initialized"})
        send({"id": 2, "method": "tools/list", "params": {}})
        answers.append(answer())
        calls = [("echo", {"text": "héllo"}), ("add", {"a": 2, "b": 40}), ("add", {"a": "2", "b": 3.0}),
                 ("fail", {"message": "nope"}), ("add", {"a": "x", "b": 1}), ("add", {"a": 1}),
                 ("echo", {"text": 5}), ("add", {"a": 1.5, "b": 1}), ("nope", {})]
        for number, (name, arguments) in enumerate(calls, start=10):
            call(number, name, arguments)
            answers.append(answer())
        call(30, "slow", {"seconds": 0.3})
        call(31, "echo", {"text": "first"})
        answers += [answer(), answer()]
        call(32, "slow", {"seconds": 30})
        wait_for(lambda: any(e.get("key") == "key-32" for e in tool_log(log)), timeout=20)  # it runs
        send({"method": "notifications/cancelled", "params": {"requestId": 32, "reason": "test"}})
        answers.append(answer())
        send({"id": 40, "method": "ping"})
        answers.append(answer())
        initialize(41, "1999-01-01")
        answers.append(answer())
    finally:
        stdin.close()
        process.wait(10)
    return answers


def _validation_first_line(answer: dict[str, object]) -> dict[str, object]:
    """pydantic's wording of a refused argument, which the standard library's server does not copy,
    cut to its first line ("Error executing tool add: 1 validation error for addArguments")."""
    result = answer.get("result")
    if isinstance(result, dict) and result.get("isError"):
        text = result["content"][0]["text"]
        return {**answer, "result": {**result, "content": [{"type": "text", "text": text.split("\n")[0]}]}}
    return answer


def test_the_stdio_tools_server_answers_as_fastmcp_does(tmp_path: Path) -> None:
    """tests/fakes/tools_server.py serves stdio with the standard library (a second of CPU less per
    worker start than FastMCP's import): every answer, in order, is FastMCP's own, but for the
    wording of pydantic's validation errors; and the protocol versions are the mcp package's."""
    from mcp.shared.version import SUPPORTED_PROTOCOL_VERSIONS

    from tests.fakes import tools_server

    assert list(tools_server.PROTOCOL_VERSIONS) == SUPPORTED_PROTOCOL_VERSIONS
    ours, fastmcp = _exchange(tmp_path), _exchange(tmp_path, "--fastmcp")
    assert [_validation_first_line(a) for a in ours] == [_validation_first_line(a) for a in fastmcp]
    assert [a["id"] for a in ours[-5:]] == [31, 30, 32, 40, 41]  # a quick call passes a slow one
    assert ours[-3] == {"jsonrpc": "2.0", "id": 32, "error": {"code": 0, "message": "Request cancelled"}}
    # The same executions, with the same keys, in the same order (each server its own pid).
    logged = [tool_log(tmp_path / f"tools{n}.log") for n in (0, 1)]
    assert [{k: v for k, v in e.items() if k != "pid"} for e in logged[0]] == [
        {k: v for k, v in e.items() if k != "pid"} for e in logged[1]
    ]
    assert len(logged[0]) == 8 and logged[0][0]["key"] == "key-10"


class _SiteHandler(BaseHTTPRequestHandler):
    pages: ClassVar[dict[str, tuple[str, bytes]]] = {
        "/page.txt": ("text/plain", b"Sophos fetch fixture.\nSecond line.\n"),
        "/page.html": ("text/html", b"<html><body><h1>Title</h1><p>Some <b>bold</b> text.</p></body></html>"),
    }

    def do_GET(self) -> None:
        if self.path not in self.pages:
            self.send_error(404)  # robots.txt: 404 means "allowed"
            return
        content_type, body = self.pages[self.path]
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def site() -> Iterator[str]:
    with serving(_SiteHandler) as url:
        yield url


async def test_fetch_server_from_the_test_config_reads_loopback(site: str, sophos_env: SophosEnv) -> None:
    config = json.loads((with_fetch(sophos_env).config_dir / "mcp.json").read_text())["mcpServers"]["fetch"]
    connection = StdioConnection(
        transport="stdio", command=config["command"], args=config["args"], env=config["env"]
    )
    client = MultiServerMCPClient({"fetch": connection})
    node_modules = Path(readabilipy.__file__).parent / "javascript" / "node_modules"
    had_node_modules = node_modules.exists()
    started = time.monotonic()
    async with client.session("fetch") as session:
        (fetch,) = await load_mcp_tools(session)
        startup = time.monotonic() - started
        assert fetch.name == "fetch"
        schema = fetch.args_schema
        assert isinstance(schema, dict)
        assert set(schema["properties"]) == {"url", "max_length", "start_index", "raw"}
        text_url, html_url = f"{site}/page.txt", f"{site}/page.html"
        text = await fetch.ainvoke({"url": text_url})
        html = await fetch.ainvoke({"url": html_url})
    assert text[0]["text"] == (
        "Content type text/plain cannot be simplified to markdown, but here is the raw content:\n"
        f"Contents of {text_url}:\nSophos fetch fixture.\nSecond line.\n"
    )
    # Converted without node (see tests/support/env.py): no npm install happened.
    assert html[0]["text"].startswith(f"Contents of {html_url}:\n")
    assert "Some bold text." in html[0]["text"].replace("**", "")  # pure Python drops the bold
    assert node_modules.exists() == had_node_modules
    assert startup < 10, f"fetch session took {startup:.2f}s to start"


# --- Redis -----------------------------------------------------------------------------------


async def test_redis_fixture_is_flushed_and_decodes(redis: Redis, redis_server: RedisServer) -> None:
    assert await redis.dbsize() == 0
    await redis.set("k", "v")
    assert await redis.get("k") == "v"
    assert redis_server.url == f"redis://127.0.0.1:{redis_server.port}/0"


async def test_redis_fixture_flushed_again(redis: Redis) -> None:
    assert await redis.get("k") is None


async def test_redis_restart_keeps_aof_data_on_the_same_port(
    start_redis: Callable[..., RedisServer],
) -> None:
    server = start_redis(appendonly=True)
    port = server.port
    # redis-py 5 does not retry by default: without this, the first command on each
    # pooled connection after a restart fails with "Connection closed by server".
    client = Redis.from_url(
        server.url,
        decode_responses=True,
        retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 5),
        retry_on_error=[RedisConnectionError],
    )
    try:
        await client.xadd("stream", {"n": "1"}, id="1-0")
        await client.set("k", "v")
        server.restart(signal.SIGKILL)
        assert server.port == port
        assert await client.get("k") == "v"
        assert await client.xrange("stream") == [("1-0", {"n": "1"})]
        assert server.stop(signal.SIGTERM) == 0
        assert not server.running
        server.start()
        assert await client.get("k") == "v"
    finally:
        await client.aclose()


# --- process helpers with stand-in services --------------------------------------------------

_STANDIN_WORKER = """
import json, os, signal, sys, time
import redis
if os.environ.get("STANDIN_FAIL"):
    print("REDIS_URL: refusing to start (stand-in)", file=sys.stderr)
    sys.exit(3)
time.sleep(float(os.environ.get("STANDIN_DELAY", "0")))
r = redis.Redis.from_url(os.environ["REDIS_URL"])
r.set("sophos:worker:heartbeat", json.dumps({"pid": os.getpid()}), ex=5)
print(json.dumps({"event": "worker.started", "pid": os.getpid()}), flush=True)
signal.signal(signal.SIGTERM, lambda *a: (print(json.dumps({"event": "worker.stopped"})), sys.exit(0)))
# like an MCP server: a session of its own, out of reach of killpg
sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
child = __import__("subprocess").Popen(sleeper, start_new_session=True)
while True:
    time.sleep(0.1)
"""

_STANDIN_API = """
import os
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/api/healthz" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()
HTTPServer((os.environ["API_HOST"], int(os.environ["API_PORT"])), H).serve_forever()
"""


@pytest.fixture
def standins(tmp_path: Path) -> Path:
    """``worker.py`` and ``api.py`` stand-ins; ``python -m`` with this cwd finds them first."""
    (tmp_path / "worker.py").write_text(textwrap.dedent(_STANDIN_WORKER))
    (tmp_path / "api.py").write_text(textwrap.dedent(_STANDIN_API))
    return tmp_path


def test_sophos_env(sophos_env: SophosEnv, model: FakeOllama, redis_server: RedisServer) -> None:
    assert sophos_env["REDIS_URL"] == redis_server.url
    assert sophos_env["OLLAMA_HOST"] == model.url
    assert sophos_env["OLLAMA_MODEL"] == "test-model"
    assert sophos_env["LANGGRAPH_STRICT_MSGPACK"] == "true"
    assert "PATH" in sophos_env
    assert (sophos_env.config_dir / "system.md").read_text().startswith("You are Sophos under test.")
    servers = json.loads((sophos_env.config_dir / "mcp.json").read_text())["mcpServers"]
    assert servers["tools"]["env"]["TOOLS_LOG"] == str(sophos_env.tools_log)
    assert sophos_env.database_path == sophos_env.root / "db" / "sophos.db"
    changed = sophos_env.with_(API_TOKEN="secret", LOG_FORMAT=None)
    assert changed["API_TOKEN"] == "secret" and "LOG_FORMAT" not in changed
    assert "API_TOKEN" not in sophos_env and changed.tools_log == sophos_env.tools_log


def test_process_helpers_with_standins(standins: Path, sophos_env: SophosEnv) -> None:
    group = ProcessGroup(log_dir=standins / "logs", cwd=standins)
    try:
        worker = group.start_worker(sophos_env)
        worker.wait_for_log("worker.started", timeout=5)
        assert worker.log_records()[0] == {"event": "worker.started", "pid": worker.pid}
        children = wait_for(worker.descendants, timeout=5, message="the stand-in's child")
        api = group.start_api(sophos_env)
        assert api.url == sophos_env.api_url
        second = group.start_api(sophos_env)  # another API process gets a port of its own
        assert second.url != api.url
        assert httpx.get(f"{second.url}/api/healthz", trust_env=False).status_code == 200

        worker.signal(signal.SIGTERM)
        assert worker.wait(5) == 0
        assert "worker.stopped" in worker.log_text()

        failing = sophos_env.with_(STANDIN_FAIL="1")
        with pytest.raises(ProcessStartError, match="refusing to start"):
            group.start_worker(failing)

        # The heartbeat left by the first worker (still within its TTL) names
        # another pid: the new worker is ready only once it wrote its own.
        started = time.monotonic()
        killed = group.start_worker(sophos_env.with_(STANDIN_DELAY="0.3"))
        assert time.monotonic() - started >= 0.3
        killed.kill()
        assert killed.wait(5) == -signal.SIGKILL
        assert group.report_sections()[0][0].startswith("worker-1 (pid")
    finally:
        group.close()
    assert not any(p.alive for p in group.processes)
    assert wait_for(lambda: not any(pid_alive(c) for c in children), timeout=5, message="children killed")


# --- SSE reader against a scripted stream ----------------------------------------------------


class _SseHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    events: ClassVar[list[tuple[str, str, str]]] = [
        ("1", "token", json.dumps("Hel")),
        ("2", "token", json.dumps("lo")),
        ("3", "trace", json.dumps({"step": 1, "node": "agent", "event": "leave", "name": "agent"})),
        ("4", "end", json.dumps({"conversation": "c", "run": "r", "status": "completed"})),
    ]

    def do_GET(self) -> None:
        query = httpx.URL(self.path).params
        if query.get("conversation") == "missing":
            body = b'{"error": {"code": "NOT_FOUND", "message": "no such conversation"}}'
            self.send_response(404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        after = int(self.headers.get("Last-Event-ID") or query.get("lastEventId") or 0)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        self.wfile.write(b": ping\n\n")
        mode = query.get("conversation")
        for event_id, name, data in self.events:
            if int(event_id) <= after:
                continue
            if mode in ("drop", "silent") and name == "end":
                if mode == "silent":
                    time.sleep(2)
                return
            self.wfile.write(f"id: {event_id}\nevent: {name}\ndata: {data}\n\n".encode())
            self.wfile.flush()
            self.wfile.write(b": ping\n\n")

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def sse_site() -> Iterator[str]:
    with serving(_SseHandler, daemon_threads=True) as url:
        yield url


async def test_sse_reader(sse_site: str) -> None:
    events = read_sse(sse_site, "c", timeout=5)
    assert events.types == ["token", "token", "trace", "end"]
    assert events.ids == ["1", "2", "3", "4"] and events.last_id == "4"
    assert events.text == "Hello" and events.ended and events.pings == 4
    assert events.terminal is not None and events.terminal.data["status"] == "completed"

    assert read_sse(sse_site, "c", last_event_id=2, timeout=5).ids == ["3", "4"]
    assert (await read_sse_async(sse_site, "c", last_event_id="3", via_query=True, timeout=5)).ids == ["4"]

    cut = await read_sse_async(sse_site, "c", stop_after=2, timeout=5)
    assert cut.cut and cut.ids == ["1", "2"] and not cut.ended

    with pytest.raises(SseDropped):
        read_sse(sse_site, "drop", timeout=5)
    dropped = await read_sse_async(sse_site, "drop", timeout=5, allow_drop=True)
    assert dropped.dropped and dropped.ids == ["1", "2", "3"]

    with pytest.raises(SseTimeout) as info:
        await read_sse_async(sse_site, "silent", timeout=0.5)
    assert info.value.events.ids == ["1", "2", "3"]

    with pytest.raises(SseError) as error:
        read_sse(sse_site, "missing", timeout=5)
    assert error.value.status_code == 404 and "NOT_FOUND" in error.value.body
