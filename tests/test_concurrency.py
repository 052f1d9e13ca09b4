"""WORKER_CONCURRENCY=4: one worker runs four conversations at once, and each keeps every guarantee.

Real worker, API, Redis and SQLite. Each conversation's model replies are routed to
it by a marker in its first message (``FakeOllama.script_for``): four runs ask the
model at once, and a shared script would hand out replies in whatever order the
requests arrive. What holds for one run at a time must hold for each of the four:
its own tokens in its own stream, a cancel that stops only it, a SIGTERM drain that
stops all of them at a step boundary, a kill -9 at any checkpoint after which each
resumes to the transcript of an uninterrupted run.
"""

from __future__ import annotations

import collections
import signal
from typing import Any

import pytest

from tests.fakes.ollama import FakeOllama, Hang, Reply, Text, ToolCalls
from tests.support.client import get_json, post_chat, read_sse, tool_calls, wait_for
from tests.support.env import SophosEnv, mcp_servers
from tests.support.faults import accepted, integrity, queue_is_clean, transcript
from tests.support.http import http_client
from tests.support.procs import wait_worker_ready

N = 4


def marker(i: int) -> str:
    return f"[conversation {i}]"


@pytest.fixture
def env(sophos_env: SophosEnv) -> SophosEnv:
    """Four runs at once; only the fake tools server (the fetch server is not needed)."""
    tools = mcp_servers(sophos_env.tools_log, sophos_env.root)["mcpServers"]["tools"]  # type: ignore[index]
    sophos_env.write_mcp_config({"mcpServers": {"tools": tools}})
    return sophos_env.with_(WORKER_CONCURRENCY=N)


def start_both(env: SophosEnv, start_worker, start_api, worker_env: SophosEnv | None = None):
    worker = start_worker(worker_env or env, wait_ready=False)
    api = start_api(env)
    wait_worker_ready(worker, env.redis_url)
    return worker, api


def cancel(api_url: str, run: str) -> int:
    with http_client(base_url=api_url, timeout=10) as http:
        return http.post(f"/api/runs/{run}/cancel").status_code


def running(api_url: str) -> set[str]:
    return {r["id"] for r in get_json(api_url, "/api/runs", status="running")["runs"]}


def test_four_conversations_run_at_once_and_a_fifth_waits_for_a_free_slot(
    env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    hangs = [Hang(text=f"c{i} thinking ", then=Text(f"answer {i}")) for i in range(N + 1)]
    for i, hang in enumerate(hangs):
        model.script_for(marker(i), hang)
    _, api = start_both(env, start_worker, start_api)
    runs = [accepted(api.url, f"{marker(i)} hello") for i in range(N + 1)]

    for hang in hangs[:N]:
        hang.wait_started(20)  # all four are answering at the same time
    assert running(api.url) == {run for _, run in runs[:N]}
    assert get_json(api.url, "/api/runs")["worker"]["concurrency"] == N
    fifth = get_json(api.url, f"/api/runs/{runs[N][1]}")
    assert fifth["status"] == "queued" and fifth["position"] == 0, fifth
    assert not hangs[N].started.is_set()

    # One conversation still has one run at a time.
    again = post_chat(api.url, "and another thing", conversation=runs[0][0])
    assert again.status_code == 409 and again.json()["error"]["code"] == "SESSION_IN_PROGRESS"

    # A cancel stops its own run only, and frees a slot for the fifth.
    conversation, run = runs[1]
    assert cancel(api.url, run) == 202
    stream = read_sse(api.url, conversation)
    assert stream[-1].event == "end" and stream[-1].data["status"] == "cancelled"
    assert stream.text == "c1 thinking "
    hangs[N].wait_started(20)
    assert all(not hangs[i].finished.is_set() for i in (0, 2, 3))

    for hang in hangs:
        hang.release()
    for i, (conversation, run) in enumerate(runs):
        if i == 1:
            continue
        events = read_sse(api.url, conversation)
        assert events[-1].event == "end" and events[-1].data == {
            "conversation": conversation, "run": run, "status": "completed"
        }
        assert events.text == f"c{i} thinking answer {i}"  # its own tokens, no one else's
        assert queue_is_clean(env.redis_url, conversation) == []
    assert integrity(env.database_path) == "ok"


def test_sigterm_stops_all_four_at_a_step_boundary_and_each_resumes(
    env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    hangs = []
    for i in range(N):
        hang = Hang(text=f"c{i} ", then=ToolCalls([("tools__echo", {"text": f"c{i}"})]))
        hangs.append(hang)
        model.script_for(marker(i), hang, Text(f"finished {i}."))
    worker, api = start_both(env, start_worker, start_api)
    runs = [accepted(api.url, f"{marker(i)} take your time") for i in range(N)]
    for hang in hangs:
        hang.wait_started(20)

    worker.signal(signal.SIGTERM)
    worker.wait_for_log(f'"draining_runs": {N}')  # asked while every model step runs
    for hang in hangs:
        hang.release()  # each model step completes; each drain stops before its tools step
    # Within SHUTDOWN_TIMEOUT (10 s here) plus closing time, at the boundaries, not cut short.
    assert worker.wait(20) == 0
    assert "worker.drain_timeout" not in worker.log_text()
    assert tool_calls(env.tools_log) == []
    for conversation, run in runs:
        stream = read_sse(api.url, conversation)
        assert stream[-1].event == "chat-error" and stream[-1].data["code"] == "INTERRUPTED"
        assert get_json(api.url, f"/api/runs/{run}")["status"] == "interrupted"

    start_worker(env)
    for conversation, _ in runs:
        accepted(api.url, conversation=conversation, resume=True)
    for i, (conversation, _) in enumerate(runs):
        events = read_sse(api.url, conversation)
        assert events[-1].event == "end" and events[-1].data["status"] == "completed"
        assert events.text == f"finished {i}."
    echoed = collections.Counter(call["args"]["text"] for call in tool_calls(env.tools_log, "echo"))
    assert echoed == {f"c{i}": 1 for i in range(N)}


def two_rounds(i: int) -> tuple[ToolCalls, ToolCalls, Text]:
    return (
        ToolCalls([("tools__echo", {"text": f"c{i}"})]),
        ToolCalls([("tools__add", {"a": i, "b": 10})]),
        Text(f"Two rounds done for {i}."),
    )


def two_rounds_by_state(body: dict[str, Any]) -> Reply | None:
    """The reply of :func:`two_rounds` that the conversation is at: the number of tool results
    since its last user message. A model call cut by the kill and made again after the restart
    gets the same reply (a queued script would hand it the next one)."""
    messages = body.get("messages") or []
    users = [k for k, m in enumerate(messages) if m.get("role") == "user"]
    if not users:
        return None
    first = str(messages[users[0]].get("content", ""))
    i = next((i for i in range(N) if marker(i) in first), None)
    if i is None:
        return None
    results = sum(1 for m in messages[users[-1] :] if m.get("role") == "tool")
    return two_rounds(i)[min(results, 2)]


# Checkpoint writes since the worker started, all four runs together (worker/faults.py):
# each run of two tool rounds writes seven: early (runs still queued), in the middle, late
# (some already completed).
KILLS = {
    "after-checkpoint-2": {"SOPHOS_FAULT_KILL_AFTER_CHECKPOINT": 2},
    "after-checkpoint-9": {"SOPHOS_FAULT_KILL_AFTER_CHECKPOINT": 9},
    "before-checkpoint-14": {"SOPHOS_FAULT_KILL_BEFORE_CHECKPOINT": 14},
    "after-checkpoint-22": {"SOPHOS_FAULT_KILL_AFTER_CHECKPOINT": 22},
}


@pytest.mark.fault
@pytest.mark.parametrize("name", list(KILLS))
def test_kill_with_four_runs_in_flight_then_each_resumes_to_an_uninterrupted_transcript(
    name: str, env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    model.answer_by(two_rounds_by_state)
    doomed, api = start_both(env, start_worker, start_api, worker_env=env.with_(**KILLS[name]))
    runs = [accepted(api.url, f"{marker(i)} two rounds please") for i in range(N)]
    assert doomed.wait(30) == -signal.SIGKILL
    assert integrity(env.database_path) == "ok"

    start_worker(env)

    def recovered() -> dict[str, Any] | None:
        """The runs once the new worker has recorded the dead one's as interrupted (its
        heartbeat can come before its start-up recovery)."""
        infos = {run: get_json(api.url, f"/api/runs/{run}") for _, run in runs}
        return infos if any(info["status"] == "interrupted" for info in infos.values()) else None

    infos = wait_for(recovered, timeout=30, message="a run recorded interrupted by the new worker")
    # A run still queued at the kill was never started: the new worker runs it.
    assert {info["status"] for info in infos.values()} <= {"interrupted", "completed", "queued", "running"}
    kept = set()  # killed after their final checkpoint: the answer is kept, nothing to resume
    for i, (conversation, run) in enumerate(runs):
        if infos[run]["status"] != "interrupted":
            continue
        assert queue_is_clean(env.redis_url, conversation) == []
        detail = get_json(api.url, f"/api/conversations/{conversation}")
        if detail["resumable"]:
            accepted(api.url, conversation=conversation, resume=True)
        elif not detail["messages"]:  # killed before its input was recorded: sent again
            assert "send it again" in infos[run]["error"]["message"]
            accepted(api.url, f"{marker(i)} two rounds please", conversation)
        else:
            kept.add(conversation)
    for conversation, _ in runs:
        last = read_sse(api.url, conversation)[-1]
        assert last.event == "end" or (conversation in kept and last.data["code"] == "INTERRUPTED")
        assert get_json(api.url, f"/api/conversations/{conversation}")["resumable"] is False

    # The same scripts on fresh conversations, without a fault, four at once again.
    controls = [accepted(api.url, f"{marker(i)} two rounds please, again") for i in range(N)]
    for conversation, _ in controls:
        assert read_sse(api.url, conversation)[-1].event == "end"
    for (faulted, _), (control, _) in zip(runs, controls, strict=True):
        assert transcript(api.url, faulted)[1:] == transcript(api.url, control)[1:]

    # A checkpointed step never runs again; only a step in flight at the kill may have.
    executed = collections.Counter(
        (call["tool"], str(sorted(call["args"].items()))) for call in tool_calls(env.tools_log)
    )
    for i in range(N):
        for tool, args in (("echo", {"text": f"c{i}"}), ("add", {"a": i, "b": 10})):
            count = executed[(tool, str(sorted(args.items())))]
            assert 2 <= count <= 3, (tool, args, count)  # the faulted run (once or twice) + its control
    assert integrity(env.database_path) == "ok"
