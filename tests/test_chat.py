"""A chat, end to end: real API, worker, Redis, SQLite and MCP servers; fake model over HTTP."""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import ClassVar, cast

import pytest
import redis as redis_sync

from shared.redis.keys import events_key
from tests.fakes.ollama import FakeOllama, Text, ToolCalls
from tests.support.client import chat, get_json, read_sse, tool_calls, wait_for
from tests.support.env import SYSTEM_PROMPT, SophosEnv, with_fetch
from tests.support.loopback import serving

# The chat contract holds on both databases.
pytestmark = pytest.mark.backends


@pytest.fixture
def stack(sophos_env: SophosEnv, start_worker, start_api) -> SophosEnv:
    start_worker(sophos_env)
    start_api(sophos_env)
    return sophos_env


def test_message_streams_tokens_then_end_and_history_reaches_the_model(
    stack: SophosEnv, model: FakeOllama
) -> None:
    model.script(Text("Hello there, friend."), Text("Second answer."))
    conversation, run = chat(stack.api_url, "first message")

    events = read_sse(stack.api_url, conversation)
    assert events.text == "Hello there, friend."
    assert len(events.of("token")) > 1
    assert events[-1].event == "end"
    assert events[-1].data == {"conversation": conversation, "run": run, "status": "completed"}
    ids = [int(i) for i in events.ids if i is not None]
    assert ids == sorted(ids) and len(set(ids)) == len(ids) == len(events)

    _, run2 = chat(stack.api_url, "second message", conversation)
    assert run2 != run
    events2 = read_sse(stack.api_url, conversation)
    assert events2.text == "Second answer."
    assert events2[-1].data["run"] == run2

    sent = model.requests[1]["messages"]
    assert [(m["role"], m.get("content")) for m in sent] == [
        ("system", SYSTEM_PROMPT),
        ("user", "first message"),
        ("assistant", "Hello there, friend."),
        ("user", "second message"),
    ]

    detail = get_json(stack.api_url, f"/api/conversations/{conversation}")
    roles = [(m["role"], m["content"]) for m in detail["messages"]]
    assert roles == [
        ("user", "first message"),
        ("assistant", "Hello there, friend."),
        ("user", "second message"),
        ("assistant", "Second answer."),
    ]
    assert detail["resumable"] is False
    assert detail["conversation"]["messageCount"] == 4
    listing = get_json(stack.api_url, "/api/conversations")["conversations"]
    assert [c["id"] for c in listing] == [conversation]
    assert listing[0]["status"] == "completed" and listing[0]["title"] == "first message"
    export = get_json(stack.api_url, f"/api/conversations/{conversation}/export", raw=True)
    assert SYSTEM_PROMPT not in export and "Second answer." in export


def test_tool_call_appears_in_traces_detail_and_both_exports(
    stack: SophosEnv, model: FakeOllama
) -> None:
    model.script(ToolCalls([("tools__add", {"a": 2, "b": 3})]), Text("The sum is 5."))
    conversation, run = chat(stack.api_url, "add 2 and 3")
    events = read_sse(stack.api_url, conversation)

    traces = [e.data for e in events.of("trace")]
    call = next(t for t in traces if t["event"] == "call")
    result = next(t for t in traces if t["event"] == "result")
    assert call["name"] == "tools__add" and call["data"]["arguments"] == {"a": 2, "b": 3}
    assert result["data"]["result"] == "5"
    assert result["data"]["tool_call_id"] == call["data"]["tool_call_id"]
    assert {(t["node"], t["event"]) for t in traces} >= {("agent", "enter"), ("tools", "leave")}
    assert events.text == "The sum is 5."
    assert [c["args"] for c in tool_calls(stack.tools_log, "add")] == [{"a": 2, "b": 3}]

    # The tool's result went back to the model.
    assert model.requests[1]["messages"][-1] == {"role": "tool", "content": "5"} | {
        k: v for k, v in model.requests[1]["messages"][-1].items() if k not in ("role", "content")
    }

    messages = get_json(stack.api_url, f"/api/conversations/{conversation}")["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[1]["toolCalls"][0]["name"] == "tools__add"
    assert messages[1]["toolCalls"][0]["arguments"] == {"a": 2, "b": 3}
    assert messages[2]["name"] == "tools__add" and messages[2]["content"] == "5"
    assert messages[2]["toolCallId"] == messages[1]["toolCalls"][0]["id"]

    markdown = get_json(stack.api_url, f"/api/conversations/{conversation}/export", raw=True)
    assert "tools__add" in markdown and "The sum is 5." in markdown
    lines = get_json(stack.api_url, f"/api/conversations/{conversation}/export?format=jsonl", raw=True)
    checkpoints = [json.loads(line) for line in lines.splitlines() if line.strip()]
    assert checkpoints and all(c["run_id"] == run for c in checkpoints)
    steps = [c["step"] for c in checkpoints]
    assert steps == sorted(steps)  # oldest first
    new_messages = [m for c in checkpoints for m in c["messages"]]
    assert [m["role"] for m in new_messages] == ["user", "assistant", "tool", "assistant"]


class _Page(BaseHTTPRequestHandler):
    hits: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        type(self).hits.append(self.path)
        if self.path != "/page.txt":
            self.send_error(404)
            return
        body = b"Sophos fetch fixture: 42 lanterns.\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def page_server() -> Iterator[str]:
    with serving(_Page) as url:
        yield url


def test_fetch_tool_reads_a_loopback_page(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama, page_server: str
) -> None:
    stack = with_fetch(sophos_env)
    start_worker(stack)
    start_api(stack)
    model.script(ToolCalls([("fetch__fetch", {"url": f"{page_server}/page.txt"})]), Text("42 lanterns."))
    conversation, _ = chat(stack.api_url, "how many lanterns?")
    events = read_sse(stack.api_url, conversation)
    result = next(e.data for e in events.of("trace") if e.data["event"] == "result")
    assert "42 lanterns" in result["data"]["result"]
    assert "/page.txt" in _Page.hits
    assert events[-1].event == "end"


def test_late_subscriber_and_last_event_id(stack: SophosEnv, model: FakeOllama) -> None:
    model.script(Text("one two three four five six"))
    conversation, run = chat(stack.api_url, "count")
    # Late for certain: the run's end event is in its stream before anyone subscribes.
    redis = redis_sync.Redis.from_url(stack.redis_url, decode_responses=True)
    try:
        def ended() -> bool:
            entries = cast(list[tuple[str, dict[str, str]]], redis.xrange(events_key(run)))
            return any(fields["type"] == "end" for _, fields in entries)

        wait_for(ended, 20, message="the run's end event in its stream")
    finally:
        redis.close()
    full = read_sse(stack.api_url, conversation)
    assert full[-1].event == "end" and full.text == "one two three four five six"
    assert full[0].id == "1"  # from the start
    again = read_sse(stack.api_url, conversation)
    assert [(e.id, e.event, e.data) for e in again] == [(e.id, e.event, e.data) for e in full]
    cut = full[3].id
    rest = read_sse(stack.api_url, conversation, last_event_id=cut)
    assert [e.id for e in rest] == [e.id for e in full[4:]]
    rest_q = read_sse(stack.api_url, conversation, last_event_id=cut, via_query=True)
    assert [e.id for e in rest_q] == [e.id for e in full[4:]]


def test_recursion_limit_fails_the_run(sophos_env: SophosEnv, start_worker, start_api, model) -> None:
    env = sophos_env.with_(AGENT_RECURSION_LIMIT=3)
    start_worker(env)
    start_api(env)
    model.script(*[ToolCalls([("tools__echo", {"text": str(i)})]) for i in range(10)])
    conversation, run = chat(env.api_url, "loop forever")
    events = read_sse(env.api_url, conversation)
    assert events[-1].event == "chat-error"
    assert events[-1].data["code"] == "RECURSION_LIMIT" and events[-1].data["run"] == run
    status = get_json(env.api_url, f"/api/runs/{run}")
    assert status["status"] == "failed" and status["error"]["code"] == "RECURSION_LIMIT"


@pytest.mark.parametrize("missing", ["server", "model"])
def test_model_unavailable(sophos_env: SophosEnv, start_worker, start_api, model, missing: str) -> None:
    from tests.support.ports import free_port

    env = (
        sophos_env.with_(OLLAMA_HOST=f"http://127.0.0.1:{free_port()}")
        if missing == "server"
        else sophos_env.with_(OLLAMA_MODEL="no-such-model")
    )
    start_worker(env)
    start_api(env)
    conversation, _ = chat(env.api_url, "hello?")
    events = read_sse(env.api_url, conversation)
    assert events[-1].event == "chat-error"
    assert events[-1].data["code"] == "MODEL_UNAVAILABLE", events[-1].data
    ready = get_json(env.api_url, "/api/readyz", expect=503)
    assert ready["checks"]["model"] is False and "model" in ready["error"]["message"]
