"""Stop means stop: a cancel cuts a running run at once, mid-answer, mid-tool or between steps.

Real worker, API, Redis and SQLite; the model is the fake Ollama streaming slowly,
the tools the fake MCP server (``slow`` sleeps). What each test checks, after the
cut: the run ended ``cancelled`` with its ``end`` event; what was streamed is in
the conversation, marked stopped; every tool call has a result; the conversation
is not resumable into the step that was cut; the next message is accepted at once
and the model receives a valid history for it.
"""

from __future__ import annotations

import signal
import time
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from shared.redis.keys import cancel_key
from tests.fakes.ollama import FakeOllama, Hang, Text, ToolCalls
from tests.support.client import get_json, read_sse, read_sse_async, tool_calls, tool_log, wait_for
from tests.support.env import SophosEnv
from tests.support.faults import DatabaseLock, accepted
from tests.support.http import http_client

#: The contract (DESIGN.md, docs/api.md "Cancelling"): from the cancel request to the run's
#: ``end`` event, at most this long. A generous bound, not a speed figure: the cut
#: itself takes a few milliseconds plus two SQLite commits (see docs/api.md).
CANCEL_BOUND_SECONDS = 1.0
#: a 150-token answer streamed over 7.5 s: a run that is not cut completes
LONG_ANSWER = Text(" ".join(f"word{i}" for i in range(150)), token_delay=0.05)
STREAM_TIMEOUT = 30.0


@pytest.fixture
def env(sophos_env: SophosEnv) -> SophosEnv:
    return sophos_env


def cancel(api_url: str, run_id: str) -> httpx.Response:
    with http_client(base_url=api_url, timeout=10) as http:
        return http.post(f"/api/runs/{run_id}/cancel")


async def cancel_and_time(api_url: str, conversation: str, run: str, seen: Any) -> tuple[float, Any]:
    """Cancel ``run``, read its stream on from ``seen``; seconds from the request to ``end``."""
    asked = time.monotonic()
    response = cancel(api_url, run)
    assert response.status_code == 202, response.text
    assert response.json()["cancelRequested"] is True
    rest = await read_sse_async(api_url, conversation, seen.last_id, timeout=STREAM_TIMEOUT)
    took = time.monotonic() - asked
    assert rest[-1].event == "end", rest.types
    assert rest[-1].data == {"conversation": conversation, "run": run, "status": "cancelled"}
    return took, rest


def assert_valid_history(wire_messages: list[dict[str, Any]]) -> None:
    """What the model received: every assistant tool call is followed by a tool result."""
    for i, message in enumerate(wire_messages):
        calls = message.get("tool_calls") or []
        if message["role"] == "assistant" and calls:
            following = [m["role"] for m in wire_messages[i + 1 : i + 1 + len(calls)]]
            assert following == ["tool"] * len(calls), wire_messages


def assert_thread_closed(api_url: str, conversation: str) -> list[dict[str, Any]]:
    """Every tool call answered, nothing left to run; returns the messages."""
    detail = get_json(api_url, f"/api/conversations/{conversation}")
    assert detail["resumable"] is False
    assert detail["conversation"]["status"] == "cancelled"
    messages: list[dict[str, Any]] = detail["messages"]
    answered = {m["toolCallId"] for m in messages if m["role"] == "tool"}
    for message in messages:
        for call in message.get("toolCalls", []):
            assert call["id"] in answered, messages
    return messages


async def test_a_cancel_mid_answer_ends_the_run_at_once_and_keeps_what_was_streamed(
    env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    model.script(LONG_ANSWER, Text("A short one."))
    start_worker(env)
    api = start_api(env).url
    conversation, run = accepted(api, "tell me a long story")
    seen = await read_sse_async(api, conversation, stop_after=20, timeout=STREAM_TIMEOUT)
    # enter, the id the answer is stored under (worker/run/publish/stream.py), then tokens
    assert seen.types[:2] == ["trace", "trace"] and set(seen.types[2:]) == {"token"}

    took, rest = await cancel_and_time(api, conversation, run, seen)
    print(f"\ncancel to end, mid-answer: {took * 1000:.0f} ms")
    assert took < CANCEL_BOUND_SECONDS, f"cancel to end took {took:.3f}s"
    streamed = seen.text + rest.text
    assert 0 < len(streamed) < len(LONG_ANSWER.text)
    assert LONG_ANSWER.text.startswith(streamed)
    assert rest.of("trace")[-1].data == {
        "step": 1, "node": "agent", "event": "leave", "name": "agent", "data": {"stopped": True},
    }
    info = get_json(api, f"/api/runs/{run}")
    assert info["status"] == "cancelled" and "error" not in info and info["stepCount"] == 1

    # The streamed part is the assistant's reply, marked stopped; nothing is left to run.
    messages = assert_thread_closed(api, conversation)
    assert [(m["role"], m["content"], m.get("status")) for m in messages] == [
        ("user", "tell me a long story", None), ("assistant", streamed, "stopped"),
    ]
    export = get_json(api, f"/api/conversations/{conversation}/export", raw=True)
    assert "## Assistant (stopped)" in export

    # The conversation takes the next message at once, and the model sees the cut reply.
    _, following = accepted(api, "shorter, please", conversation)
    events = read_sse(api, conversation, timeout=STREAM_TIMEOUT)
    assert events[-1].data == {"conversation": conversation, "run": following, "status": "completed"}
    assert events.text == "A short one."
    sent = model.requests[-1]["messages"]
    assert [(m["role"], m["content"]) for m in sent[1:]] == [
        ("user", "tell me a long story"), ("assistant", streamed), ("user", "shorter, please"),
    ]
    assert_valid_history(sent)
    assert model.calls == 2


async def test_a_cancel_during_a_slow_tool_call_answers_the_calls_as_stopped(
    env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    # Two calls in one step, a task each (worker/agent/graph.py): echo returns at once, slow takes 3 s.
    model.script(
        ToolCalls([("tools__echo", {"text": "quick"}), ("tools__slow", {"seconds": 3.0})]),
        ToolCalls([("tools__echo", {"text": "still works"})]),
        Text("Echoed."),
    )
    start_worker(env)
    api = start_api(env).url
    conversation, run = accepted(api, "take your time")
    wait_for(
        lambda: tool_calls(env.tools_log, "slow") and tool_calls(env.tools_log, "echo"),
        timeout=STREAM_TIMEOUT, message="both tools started",
    )
    seen = await read_sse_async(api, conversation, stop_after=5, timeout=STREAM_TIMEOUT)
    assert [e.data["event"] for e in seen] == ["enter", "call", "call", "leave", "enter"]

    took, rest = await cancel_and_time(api, conversation, run, seen)
    print(f"\ncancel to end, mid-tool: {took * 1000:.0f} ms")
    assert took < CANCEL_BOUND_SECONDS, f"cancel to end took {took:.3f}s"
    call_ids = [e.data["data"]["tool_call_id"] for e in seen[1:3]]
    traces = [e.data for e in rest.of("trace")]
    # Each task entered and left (the slow one's leave says it was stopped), all in step 2.
    assert [t["event"] for t in traces if t["event"] != "result"] == ["enter", "leave", "leave"]
    assert {t["step"] for t in traces} == {2} and {t["node"] for t in traces} == {"tools"}
    assert traces[-1]["data"] == {"stopped": True}
    # Echo had returned before the cut: its real result stays; only the slow call is stopped.
    results = {t["data"]["tool_call_id"]: t["data"] for t in traces if t["event"] == "result"}
    assert {i: (r["status"], r["result"]) for i, r in results.items() if r["status"] != "stopped"} == {
        call_ids[0]: ("success", "quick"),
    }
    assert results[call_ids[1]]["status"] == "stopped"
    assert get_json(api, f"/api/runs/{run}")["status"] == "cancelled"

    # Echo's result as it came, the slow call answered as stopped, then the model's turn ends
    # with an empty stopped reply.
    messages = assert_thread_closed(api, conversation)
    assert [(m["role"], m.get("status")) for m in messages] == [
        ("user", None), ("assistant", None), ("tool", "success"), ("tool", "stopped"),
        ("assistant", "stopped"),
    ]
    assert [m["toolCallId"] for m in messages[2:4]] == call_ids
    assert messages[2]["content"] == "quick" and "stopped" in messages[3]["content"]
    assert messages[4]["content"] == ""
    # The tool server was not told: it finishes the call it had started (docs/api.md, "Cancelling").
    wait_for(
        lambda: any(e.get("event") == "done" for e in tool_log(env.tools_log)),
        timeout=STREAM_TIMEOUT, message="the slow tool finished on its server",
    )

    # The next message at once; the same tool session serves it; the model sees a valid thread.
    _, following = accepted(api, "now echo", conversation)
    events = read_sse(api, conversation, timeout=STREAM_TIMEOUT)
    assert events[-1].data["run"] == following and events[-1].data["status"] == "completed"
    results = [r.data["data"] for r in events.of("trace") if r.data["event"] == "result"]
    assert [(r["status"], r["result"]) for r in results] == [("success", "still works")]
    assert events.text == "Echoed."
    sent = model.requests[-1]["messages"]
    assert [m["role"] for m in sent[1:]] == [
        "user", "assistant", "tool", "tool", "assistant", "user", "assistant", "tool",
    ]
    assert_valid_history(sent)
    assert len(tool_calls(env.tools_log, "slow")) == 1  # never run again
    # One server process served all three calls: the abandoned call did not cost the session.
    assert len({c["pid"] for c in tool_calls(env.tools_log)}) == 1


async def test_a_cancel_between_steps_stops_before_the_tool_runs(
    env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    """The model's answer is in, its step is being saved (the database held), the tool not started."""
    hang = Hang(text="Looking. ", then=ToolCalls([("tools__echo", {"text": "never"})]))
    model.script(hang, Text("Fine."))
    start_worker(env)
    api = start_api(env).url
    conversation, run = accepted(api, "use a tool")
    await hang.wait_started_async(STREAM_TIMEOUT)
    with DatabaseLock(env.database_path) as lock:
        hang.release()
        # The step's task finished (its trace says so) but its writes wait for the lock.
        seen = await read_sse_async(api, conversation, stop_after=5, timeout=STREAM_TIMEOUT)
        assert [e.event for e in seen] == ["trace", "trace", "token", "trace", "trace"]
        # enter, the id the answer is stored under (before its first token), then its call and leave
        assert [e.data["event"] for e in seen.of("trace")] == ["enter", "message", "call", "leave"]
        response = cancel(api, run)
        assert response.status_code == 202, response.text
        lock.release()
    rest = await read_sse_async(api, conversation, seen.last_id, timeout=STREAM_TIMEOUT)
    assert rest[-1].data == {"conversation": conversation, "run": run, "status": "cancelled"}
    assert tool_calls(env.tools_log) == []  # the tools step never started

    messages = assert_thread_closed(api, conversation)
    assert [(m["role"], m["content"], m.get("status")) for m in messages] == [
        ("user", "use a tool", None), ("assistant", "Looking. ", None),
        ("tool", messages[2]["content"], "stopped"), ("assistant", "", "stopped"),
    ]
    _, following = accepted(api, "never mind", conversation)
    assert read_sse(api, conversation, timeout=STREAM_TIMEOUT)[-1].data["run"] == following
    assert_valid_history(model.requests[-1]["messages"])


async def test_a_cancel_the_worker_did_not_hear_is_found_when_the_run_starts(
    env: SophosEnv, start_worker, start_api, model: FakeOllama, redis: Redis
) -> None:
    """The marker alone (its signal missed): the run stops before its first step, message kept."""
    worker = start_worker(env)
    api = start_api(env).url
    worker.signal(signal.SIGSTOP)  # taken from the queue only after the cancel
    try:
        conversation, run = accepted(api, "stop before you start")
        # A cancel marker without its signal, as if the worker had not been listening.
        await redis.set(cancel_key(run), "{}")
    finally:
        worker.signal(signal.SIGCONT)
    events = read_sse(api, conversation, timeout=STREAM_TIMEOUT)
    assert events[-1].data == {"conversation": conversation, "run": run, "status": "cancelled"}
    assert model.calls == 0
    messages = assert_thread_closed(api, conversation)
    assert [(m["role"], m["content"], m.get("status")) for m in messages] == [
        ("user", "stop before you start", None), ("assistant", "", "stopped"),
    ]
    model.script(Text("Started."))
    accepted(api, "go on then", conversation)
    assert read_sse(api, conversation, timeout=STREAM_TIMEOUT).text == "Started."


async def test_cancels_are_heard_again_after_a_redis_restart(
    env: SophosEnv, start_redis, start_worker, start_api, model: FakeOllama
) -> None:
    server = start_redis()  # AOF on, like every deployment
    own = env.with_(REDIS_URL=server.url)
    worker = start_worker(own)
    api = start_api(own).url
    worker.wait_for_log('"subscriptions": 1', timeout=STREAM_TIMEOUT)
    model.script(LONG_ANSWER)
    conversation, run = accepted(api, "long, across a restart")
    await read_sse_async(api, conversation, stop_after=2, timeout=STREAM_TIMEOUT)

    server.restart(signal.SIGTERM, down_for=0.5)
    worker.wait_for_log('"subscriptions": 2', timeout=STREAM_TIMEOUT)  # subscribed again
    seen = await read_sse_async(api, conversation, stop_after=5, timeout=STREAM_TIMEOUT)
    took, _ = await cancel_and_time(api, conversation, run, seen)
    assert took < CANCEL_BOUND_SECONDS, f"cancel to end took {took:.3f}s"
    assert worker.alive
