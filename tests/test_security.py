"""Security guards, each proven through the real API and worker processes.

Authentication, per-client limits, data-only queue and checkpoints, the fetch
tool kept off private addresses, logs and exports without secrets, pinned
dependencies. The negative of each guard is here too: with the token, and under
the limits, everything works as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pickle
import re
import sqlite3
import subprocess
import sys
import time
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ormsgpack
import pytest
import redis as redis_sync
from redis.asyncio import Redis

from api.auth.bearer import exposure_problem, is_loopback
from shared.contracts.jobs import JobKind, RunJob
from shared.redis.keys import QUEUE_NAME, arq_job_key
from shared.redis.queue import submit_run
from shared.settings import Settings
from tests.fakes.ollama import FakeOllama, Text, ToolCalls
from tests.support.client import SseParser, get_json, post_chat, read_sse, wait_for
from tests.support.env import SophosEnv
from tests.support.http import async_http_client, http_client
from tests.support.listeners import Listeners, loopback_listeners
from tests.support.procs import ServiceProcess

REPO = Path(__file__).resolve().parent.parent


def error_of(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, f"{response.status_code} {response.text}"
    body = response.json()
    assert set(body) == {"error"} and body["error"]["code"] == code, body
    assert body["error"]["message"]
    return str(body["error"]["message"])


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def accepted(response: httpx.Response) -> tuple[str, str]:
    assert response.status_code == 202, response.text
    return response.json()["conversation"], response.json()["run"]


def assert_not_in_logs(procs: list[ServiceProcess], *secrets: str) -> None:
    for proc in procs:
        text = proc.log_text()
        assert text.strip(), f"{proc.name} wrote no log at all"
        for secret in secrets:
            assert secret not in text, f"{secret!r} appears in the log of {proc.name}"


# --- 1. authentication ----------------------------------------------------------------------


def _api_routes(api_url: str) -> list[tuple[str, str]]:
    """Every (method, path) under /api, from the app's own OpenAPI document."""
    with http_client(base_url=api_url, timeout=10) as http:
        paths = http.get("/schema/openapi.json").json()["paths"]
    return [
        (method.upper(), path)
        for path, operations in paths.items()
        if path.startswith("/api/")
        for method in operations
        if method in ("get", "post", "put", "patch", "delete")
    ]


#: what anyone may ask: that the process is up, and how the page may sign in
PUBLIC_ROUTES = {"/api/healthz", "/api/signin"}


def test_token_guards_every_api_route_and_never_reaches_a_log(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    token, wrong = unique("token"), unique("wrong")
    env = sophos_env.with_(API_TOKEN=token)
    worker = start_worker(env)
    api = start_api(env)

    routes = _api_routes(api.url)
    assert {("POST", "/api/chat"), ("GET", "/api/chat"), ("GET", "/api/healthz")} <= set(routes)
    assert len(routes) >= 9, routes
    unknown = str(uuid.uuid4())
    refused = 0
    with http_client(base_url=api.url, timeout=10) as http:
        for method, path in routes:
            url = re.sub(r"\{[^}]+\}", unknown, path)
            # Otherwise valid requests: what answers is the guard, not validation.
            body = {"message": "hello"} if method != "GET" else None
            params = {"conversation": unknown} if path == "/api/chat" else {}
            if path in PUBLIC_ROUTES:
                assert http.request(method, url).status_code == 200
                continue
            for headers, query in (
                ({}, {}),
                ({"Authorization": f"Bearer {wrong}"}, {}),
                ({"Authorization": f"Basic {token}"}, {}),  # the right secret in the wrong scheme
                ({}, {"access_token": wrong}),
                ({"Authorization": "Bearer"}, {}),
            ):
                response = http.request(method, url, json=body, params={**params, **query}, headers=headers)
                error_of(response, 401, "UNAUTHORIZED")
                assert response.headers["WWW-Authenticate"].startswith("Bearer")
                refused += 1
        # /metrics answers only with the token, like /api/*: it tells how busy and how healthy we are.
        error_of(http.get("/metrics"), 401, "UNAUTHORIZED")
        error_of(http.get("/metrics", params={"access_token": wrong}), 401, "UNAUTHORIZED")
        assert http.get("/metrics", headers={"Authorization": f"Bearer {token}"}).status_code == 200
        # The API's description is public: it holds no data.
        assert http.get("/schema/openapi.json").status_code == 200
    assert refused == 5 * (len(routes) - len(PUBLIC_ROUTES))
    # Refused requests changed nothing.
    assert get_json(api.url, "/api/conversations", token=token)["conversations"] == []

    # With the token everything works as before: header, or query for EventSource.
    model.script(Text("Hello with a token."))
    conversation, run = accepted(post_chat(api.url, "hi", token=token))
    events = read_sse(api.url, conversation, token=token)
    assert events.text == "Hello with a token." and events[-1].event == "end"
    with (
        http_client(base_url=api.url, timeout=10) as http,
        http.stream("GET", "/api/chat", params={"conversation": conversation, "access_token": token}) as sse,
    ):
        assert sse.status_code == 200
        parser = SseParser()
        replay = [e for e in parser.feed_lines(sse.iter_lines()) if e.event in ("token", "end")]
    assert replay[-1].event == "end" and "".join(e.data for e in replay[:-1]) == "Hello with a token."
    detail = get_json(api.url, f"/api/conversations/{conversation}", token=token)
    assert [m["role"] for m in detail["messages"]] == ["user", "assistant"]
    assert get_json(api.url, f"/api/runs/{run}", token=token)["status"] == "completed"
    export = get_json(api.url, f"/api/conversations/{conversation}/export", token=token, raw=True)
    assert "Hello with a token." in export
    export = get_json(
        api.url, f"/api/conversations/{conversation}/export", raw=True, format="jsonl", access_token=token
    )
    assert "Hello with a token." in export

    # The requests were logged (paths, statuses), the tokens were not.
    paths = {r.get("path") for r in api.log_records() if r.get("event") == "request"}
    assert {"/api/chat", f"/api/conversations/{conversation}/export"} <= paths
    statuses = {r.get("status") for r in api.log_records() if r.get("event") == "request"}
    assert {200, 202, 401} <= statuses
    assert_not_in_logs([api, worker], token, wrong, "access_token", "Bearer", "Authorization")


def test_api_refuses_to_listen_beyond_loopback_without_a_token(sophos_env: SophosEnv, start_api) -> None:
    api = start_api(sophos_env.with_(API_HOST="0.0.0.0"), wait_ready=False)
    assert api.wait(20) == 2
    message = api.log_text()
    assert "refusing to start" in message
    for variable in ("API_HOST", "API_TOKEN", "ALLOW_UNAUTHENTICATED"):
        assert variable in message, message

    # The rule itself (starting those that pass would listen on every interface of this machine).
    def problem(**env: str) -> str | None:
        return exposure_problem(Settings.from_env(env))

    for host in ("0.0.0.0", "::", "192.0.2.10", "sophos.example"):
        assert problem(API_HOST=host) is not None, host
        assert problem(API_HOST=host, API_TOKEN="t") is None
        assert problem(API_HOST=host, ALLOW_UNAUTHENTICATED="true") is None
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        assert is_loopback(host) and problem(API_HOST=host) is None, host


def test_browsers_cannot_drive_a_local_api_without_a_token(sophos_env: SophosEnv, start_api) -> None:
    api = start_api(sophos_env)  # loopback, no token: the default
    port = sophos_env["API_PORT"]
    body = b'{"message": "sent by a web page"}'
    with http_client(base_url=api.url, timeout=10) as http:
        # A cross-origin "simple" request: no preflight, so the browser sends it as is.
        for origin in ("http://attacker.example", "null", f"http://127.0.0.1:{int(port) + 1}"):
            response = http.post(
                "/api/chat", content=body, headers={"Content-Type": "text/plain", "Origin": origin}
            )
            assert "cross-origin" in error_of(response, 403, "FORBIDDEN")
        # DNS rebinding: the attacker's name now resolves to 127.0.0.1, so the page is same-origin.
        rebound = {"Host": f"attacker.example:{port}", "Origin": f"http://attacker.example:{port}"}
        assert "loopback names" in error_of(http.get("/api/conversations", headers=rebound), 403, "FORBIDDEN")
        error_of(http.post("/api/chat", content=body, headers=rebound), 403, "FORBIDDEN")
        assert http.get("/api/conversations").json()["conversations"] == []
        # Clients that are not browsers, and a page of the API's own origin, are served.
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"):
            assert http.get("/api/conversations", headers={"Host": host}).status_code == 200
        same_origin = {"Origin": f"http://localhost:{port}", "Host": f"localhost:{port}"}
        accepted(http.post("/api/chat", json={"message": "hi"}, headers=same_origin))
        accepted(http.post("/api/chat", json={"message": "hi"}))


# --- 2. limits ------------------------------------------------------------------------------


def _post_as(api_url: str, client: str | None, message: str) -> httpx.Response:
    # From 127.0.0.1, a trusted proxy by default (FORWARDED_ALLOW_IPS): X-Forwarded-For names the client.
    headers = {"X-Forwarded-For": client} if client else {}
    with http_client(base_url=api_url, timeout=10) as http:
        return http.post("/api/chat", json={"message": message}, headers=headers)


def test_chat_submissions_per_client_are_limited_across_api_processes(
    sophos_env: SophosEnv, start_api
) -> None:
    env = sophos_env.with_(RATE_LIMIT_PER_MINUTE=4)
    first, second = start_api(env), start_api(env)  # no worker: runs stay queued
    for i, api in enumerate((first, second, first, second)):
        accepted(_post_as(api.url, None, f"message {i}"))

    for api in (first, second):
        response = _post_as(api.url, None, "one too many")
        message = error_of(response, 429, "RATE_LIMITED")
        assert "4 per minute" in message
        assert 1 <= int(response.headers["Retry-After"]) <= 60
    # Another client has a quota of its own; reads are not counted.
    accepted(_post_as(first.url, "192.0.2.10", "from elsewhere"))
    assert len(get_json(second.url, "/api/conversations")["conversations"]) == 5

    # A peer that is not a trusted proxy cannot choose its address with X-Forwarded-For.
    strict = start_api(env.with_(FORWARDED_ALLOW_IPS="192.0.2.1"))
    error_of(_post_as(strict.url, "198.51.100.7", "spoofed"), 429, "RATE_LIMITED")


async def test_open_event_streams_per_client_are_capped(sophos_env: SophosEnv, start_api) -> None:
    api = start_api(sophos_env.with_(MAX_STREAMS_PER_CLIENT=2))
    conversation, _ = accepted(post_chat(api.url, "wait in the queue"))  # no worker: the stream stays open
    params = {"conversation": conversation}

    async with async_http_client(base_url=api.url, timeout=10) as http:

        async def status_of_stream(headers: dict[str, str] | None = None) -> tuple[int, str]:
            async with http.stream("GET", "/api/chat", params=params, headers=headers) as response:
                body = "" if response.status_code == 200 else (await response.aread()).decode()
                return response.status_code, body

        async with contextlib.AsyncExitStack() as held:
            for _ in range(2):
                stream = await held.enter_async_context(http.stream("GET", "/api/chat", params=params))
                assert stream.status_code == 200
            status, body = await status_of_stream()
            assert status == 429 and json.loads(body)["error"]["code"] == "RATE_LIMITED", body
            assert "at most 2" in json.loads(body)["error"]["message"]
            # Another client address is counted apart.
            assert (await status_of_stream({"X-Forwarded-For": "192.0.2.20"}))[0] == 200
        # Closed streams give their slots back (the server notices the client is gone).
        deadline = time.monotonic() + 10
        while (await status_of_stream())[0] != 200:
            assert time.monotonic() < deadline, "slots of closed streams were not released"
            await asyncio.sleep(0.1)


# --- 3. nothing in Redis or SQLite becomes code ---------------------------------------------


class _MkdirWhenUnpickled:
    """A pickle whose loading calls os.mkdir(path): proof of execution is the directory."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (self.path,))


def _run_python(code: str, stdin: bytes, env: dict[str, str] | None = None) -> None:
    subprocess.run([sys.executable, "-c", code], input=stdin, check=True, timeout=60, env=env, cwd=REPO)


def test_a_pickled_job_in_the_queue_is_not_executed(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama, tmp_path: Path
) -> None:
    # The payload is armed: pickle.loads runs it.
    armed = tmp_path / "armed"
    unpickle = "import pickle, sys; pickle.loads(sys.stdin.buffer.read())"
    _run_python(unpickle, pickle.dumps(_MkdirWhenUnpickled(armed)))
    assert armed.is_dir()

    worker = start_worker(sophos_env)
    marker = tmp_path / "executed-by-job"
    job_id = unique("crafted")
    client = redis_sync.Redis.from_url(sophos_env.redis_url)
    try:
        client.set(arq_job_key(job_id), pickle.dumps(_MkdirWhenUnpickled(marker)), ex=600)
        client.zadd(QUEUE_NAME, {job_id: int(time.time() * 1000)})
        line = worker.wait_for_log(f"deserializing job {job_id} failed", timeout=20)
        # arq logs the failure, then takes the job off the queue: it is not retried.
        wait_for(lambda: client.zscore(QUEUE_NAME, job_id) is None, timeout=10, message="the job dequeued")
    finally:
        client.close()
    assert json.loads(line)["level"] == "error"
    assert not marker.exists()
    assert worker.alive
    # ... and still serving.
    api = start_api(sophos_env)
    model.script(Text("still here"))
    conversation, _ = accepted(post_chat(api.url, "are you there?"))
    assert read_sse(api.url, conversation).text == "still here"
    assert not marker.exists()


def _latest_checkpoint(db: Path, thread_id: str) -> tuple[str, str, bytes]:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        row = conn.execute(
            "SELECT checkpoint_id, type, checkpoint FROM checkpoints WHERE thread_id = ? "
            "ORDER BY checkpoint_id DESC LIMIT 1",
            (thread_id,),
        ).fetchone()
    assert row is not None, f"no checkpoint for {thread_id}"
    return str(row[0]), str(row[1]), bytes(row[2])


def _overwrite_checkpoint(db: Path, thread_id: str, checkpoint_id: str, type_: str, blob: bytes) -> None:
    with contextlib.closing(sqlite3.connect(db, timeout=10)) as conn, conn:
        updated = conn.execute(
            "UPDATE checkpoints SET type = ?, checkpoint = ? WHERE thread_id = ? AND checkpoint_id = ?",
            (type_, blob, thread_id, checkpoint_id),
        ).rowcount
    assert updated == 1


# LangGraph's msgpack extension "construct module.name(arg)" (EXT_CONSTRUCTOR_SINGLE_ARG).
EXT_CONSTRUCTOR_SINGLE_ARG = 0

CHECK_MSGPACK_ARMED = """
import sys
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
JsonPlusSerializer().loads_typed(("msgpack", sys.stdin.buffer.read()))
"""
CHECK_PICKLE_ARMED = """
import sys
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
JsonPlusSerializer(pickle_fallback=True).loads_typed(("pickle", sys.stdin.buffer.read()))
"""


def _with_mkdir_ext(blob: bytes, path: Path) -> bytes:
    """The checkpoint ``blob`` with one more channel value: an extension that runs os.mkdir(path)."""
    checkpoint = ormsgpack.unpackb(
        blob, ext_hook=lambda code, data: ormsgpack.Ext(code, data), option=ormsgpack.OPT_NON_STR_KEYS
    )
    call = ormsgpack.packb(("os", "mkdir", str(path)))
    checkpoint["channel_values"]["crafted"] = ormsgpack.Ext(EXT_CONSTRUCTOR_SINGLE_ARG, call)
    return ormsgpack.packb(checkpoint, option=ormsgpack.OPT_NON_STR_KEYS)


def test_crafted_checkpoints_fail_closed(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama, tmp_path: Path
) -> None:
    # The processes' own entry points must turn strict msgpack on: the harness's value is dropped.
    env = sophos_env.with_(LANGGRAPH_STRICT_MSGPACK=None)
    worker = start_worker(env)
    api = start_api(env)
    model.script(Text("first answer"), Text("second answer"))
    via_ext, _ = accepted(post_chat(api.url, "one"))
    assert read_sse(api.url, via_ext).text == "first answer"
    via_pickle, _ = accepted(post_chat(api.url, "two"))
    assert read_sse(api.url, via_pickle).text == "second answer"

    # A msgpack extension that would construct os.mkdir(marker) when the checkpoint is read.
    ext_marker = tmp_path / "executed-by-msgpack"
    checkpoint_id, type_, blob = _latest_checkpoint(env.database_path, via_ext)
    assert type_ == "msgpack"
    armed = tmp_path / "armed-msgpack"
    loose = {k: v for k, v in os.environ.items() if k != "LANGGRAPH_STRICT_MSGPACK"}
    _run_python(CHECK_MSGPACK_ARMED, _with_mkdir_ext(blob, armed), env=loose)
    assert armed.is_dir()  # the default (lax) serializer would run it
    crafted = _with_mkdir_ext(blob, ext_marker)
    _overwrite_checkpoint(env.database_path, via_ext, checkpoint_id, "msgpack", crafted)

    # A pickle stored as the checkpoint of the other conversation.
    pickle_marker = tmp_path / "executed-by-pickle"
    checkpoint_id, _, _ = _latest_checkpoint(env.database_path, via_pickle)
    armed = tmp_path / "armed-pickle"
    _run_python(CHECK_PICKLE_ARMED, pickle.dumps(_MkdirWhenUnpickled(armed)))
    assert armed.is_dir()
    crafted = pickle.dumps(_MkdirWhenUnpickled(pickle_marker))
    _overwrite_checkpoint(env.database_path, via_pickle, checkpoint_id, "pickle", crafted)

    # The API reads both; the worker continues the first.
    with http_client(base_url=api.url, timeout=10) as http:
        for conversation in (via_ext, via_pickle):
            for path in (f"/api/conversations/{conversation}", f"/api/conversations/{conversation}/export"):
                http.get(path)
        detail = http.get(f"/api/conversations/{via_ext}")
        assert detail.status_code == 200  # the extension came back as inert data
        for path in (f"/api/conversations/{via_pickle}", f"/api/conversations/{via_pickle}/export"):
            said = error_of(http.get(path), 500, "CONVERSATION_UNREADABLE")
            assert via_pickle in said and "pickle" in said
    model.script(Text("third answer"))
    accepted(post_chat(api.url, "three", via_ext))
    assert read_sse(api.url, via_ext).text == "third answer"
    # The worker reads the pickled one when a run continues that thread. The API
    # cannot read the conversation any more, so the job goes straight to the queue.
    run = _enqueue_run(env.redis_url, via_pickle, "four")
    worker.wait_for_log(lambda line: run in line and "Unknown serialization type: pickle" in line, timeout=20)
    # ... and records the run failed, though it cannot read the thread to count its messages.
    failed = wait_for(
        lambda: (info := get_json(api.url, f"/api/runs/{run}"))["status"] == "failed" and info,
        timeout=20, message="the run recorded failed",
    )
    assert failed["error"]["code"] == "AGENT_FAILURE" and "pickle" in failed["error"]["message"]

    assert not ext_marker.exists() and not pickle_marker.exists()
    assert worker.alive and api.alive
    blocked = "Blocked deserialization of os.mkdir"
    api.wait_for_log(blocked)
    worker.wait_for_log(blocked)
    api.wait_for_log("Unknown serialization type: pickle")
    # Nor does it keep a restarted worker from starting: a run it finds `running` on that
    # thread (as a worker killed mid-run leaves it) is recorded interrupted all the same.
    worker.kill()
    with contextlib.closing(sqlite3.connect(env.database_path, timeout=10)) as conn, conn:
        conn.execute("UPDATE runs SET status = 'running', finished_at = NULL WHERE id = ?", (run,))
    worker = start_worker(env)
    orphan = wait_for(
        lambda: (info := get_json(api.url, f"/api/runs/{run}"))["status"] == "interrupted" and info,
        timeout=20, message="the orphaned run recorded interrupted",
    )
    assert orphan["error"]["code"] == "INTERRUPTED" and worker.alive
    worker.wait_for_log(lambda line: run in line and "run.state_unreadable" in line)


def _enqueue_run(redis_url: str, conversation: str, message: str) -> str:
    job = RunJob(
        run_id=str(uuid.uuid4()),
        conversation_id=conversation,
        kind=JobKind.RUN,
        message=message,
        enqueued_at=time.time(),
    )

    async def submit() -> str | None:
        client = Redis.from_url(redis_url, decode_responses=True)
        try:
            return await submit_run(client, job, title=message)
        finally:
            await client.aclose()

    assert asyncio.run(submit()) is None
    return job.run_id


# --- 4. the fetch tool stays outside --------------------------------------------------------


@pytest.fixture
def listeners() -> Iterator[Listeners]:
    """HTTP listeners on 127.0.0.1 and [::1]."""
    with loopback_listeners("127.0.0.1", "::1") as both:
        yield both


def test_fetch_tool_refuses_private_destinations(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama, listeners: Listeners
) -> None:
    port, port6 = listeners.ports
    shipped = json.loads((REPO / "config" / "mcp.json").read_text())["mcpServers"]["fetch"]
    assert "--allow-private-ips" not in shipped["args"] and "env" not in shipped
    # The shipped server, as shipped. Its environment only adds a proxy pointing at our
    # listener: should the guard ever fail, a request to 169.254.169.254 lands here
    # (a hit, so the test fails) instead of leaving the machine.
    proxy = f"http://127.0.0.1:{port}"
    proxies = {"HTTP_PROXY": proxy, "HTTPS_PROXY": proxy, "ALL_PROXY": proxy, "NO_PROXY": ""}
    fetch = {**shipped, "env": proxies}
    sophos_env.write_mcp_config({"mcpServers": {"fetch": fetch}})
    start_worker(sophos_env)
    api = start_api(sophos_env)

    urls = [
        f"http://127.0.0.1:{port}/secret",
        f"http://localhost:{port}/secret",
        f"http://[::1]:{port6}/secret",
        f"http://0.0.0.0:{port}/secret",
        f"http://2130706433:{port}/secret",  # 127.0.0.1 as one decimal number
        "http://169.254.169.254/latest/meta-data/",  # cloud metadata
    ]
    model.script(ToolCalls([("fetch__fetch", {"url": url}) for url in urls]), Text("I could not fetch them."))
    conversation, _ = accepted(post_chat(api.url, "fetch these for me"))
    # As shipped, every fetch waits for a person first (docs/security.md: memory plus fetch).
    asked = read_sse(api.url, conversation, timeout=60)
    assert asked.types[-2:] == ["approval", "end"] and asked[-1].data["status"] == "waiting"
    requests = asked.of("approval")[0].data["requests"]
    assert sorted(r["arguments"]["url"] for r in requests) == sorted(urls)
    assert {r["kind"] for r in requests} == {"approval"}
    with http_client(base_url=api.url, timeout=10.0) as http:
        approve = [{"id": r["id"], "action": "approve"} for r in requests]
        decided = http.post("/api/chat", json={"conversation": conversation, "decisions": approve})
    assert decided.status_code == 202, decided.text
    events = read_sse(api.url, conversation, timeout=60)
    assert events[-1].event == "end"

    results = [e.data["data"] for e in events.of("trace") if e.data["event"] == "result"]
    assert len(results) == len(urls)
    for result in results:
        assert result["status"] == "error", result
        assert "not a public address" in result["result"], result
        assert "inside" not in result["result"]
    assert listeners.hits == []
    # The tool errors reached the model as tool results.
    assert [m["role"] for m in model.requests[1]["messages"]].count("tool") == len(urls)


# --- 5. logs and exports hold no secrets ----------------------------------------------------


def test_logs_and_exports_hold_no_content_tokens_or_environment(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    token, secret, content = unique("token"), unique("environment-secret"), unique("content")
    env = sophos_env.with_(API_TOKEN=token, SOPHOS_UNRELATED_SECRET=secret, SOPHOS_UNRELATED_URL=f"postgres://u:{secret}@h")
    worker = start_worker(env)
    api = start_api(env)

    model.script(ToolCalls([("tools__echo", {"text": content})]), Text(f"You said {content}."))
    conversation, _ = accepted(post_chat(api.url, f"Please echo {content}", token=token))
    events = read_sse(api.url, conversation, token=token)
    assert events.text == f"You said {content}."

    export = f"/api/conversations/{conversation}/export"
    markdown = get_json(api.url, export, token=token, raw=True)
    jsonl = get_json(api.url, export, token=token, raw=True, format="jsonl")
    detail = json.dumps(get_json(api.url, f"/api/conversations/{conversation}", token=token))
    for document in (markdown, jsonl, detail):
        # The whole conversation: the message, the tool's call and result, the answer...
        assert f"Please echo {content}" in document and f"You said {content}." in document
        assert document.count(content) >= 4, document
        # ... and nothing from the environment.
        for value in (secret, token, env.redis_url, str(env.database_path)):
            assert value not in document, value
    assert_not_in_logs([api, worker], content, token, secret)

    # LOG_CONTENT=true is what puts content in a log: this check can see it.
    loud = start_api(env.with_(LOG_CONTENT="true"))
    logged = unique("logged-content")
    model.script(Text("ok"))
    accepted(post_chat(loud.url, logged, token=token))
    loud.wait_for_log(logged)


# --- 6. dependencies ------------------------------------------------------------------------


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_dependency_is_pinned_by_the_lock() -> None:
    lock: dict[str, str] = {}
    for line in (REPO / "requirements.lock").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"requirements.lock: {line!r} is not pinned with =="
            lock[_normalized(name)] = version.strip()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["test"]]
    for requirement in wanted:
        name = _normalized(re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0])
        assert name in lock, f"{requirement!r} (pyproject.toml) has no pinned version in requirements.lock"
