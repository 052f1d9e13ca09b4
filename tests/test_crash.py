"""The crash semantics (docs/crash-semantics.md), with real processes killed by real signals."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Any

import pytest
from redis.asyncio import Redis

from shared.contracts.jobs import JobKind, RunJob
from shared.redis.keys import ACTIVE_RUNS, QUEUE_NAME
from shared.redis.queue import submit_run
from tests.fakes.ollama import FakeOllama, Hang, Text, ToolCalls
from tests.support.client import chat, get_json, post_chat, read_sse, tool_calls, wait_for, wait_for_async
from tests.support.env import SophosEnv

# On both databases: on PostgreSQL a dead worker's run is found by its lapsed lease (3 s here).
pytestmark = [pytest.mark.fault, pytest.mark.backends]


def interrupted(api_url: str, run: str) -> dict[str, Any]:
    """The run's record once the new worker has recorded it (at start-up on SQLite; within the
    lease plus one pass on PostgreSQL)."""
    return wait_for(
        lambda: (info := get_json(api_url, f"/api/runs/{run}"))["status"] != "running" and info,
        timeout=20, message=f"run {run} recorded after the crash",
    )


Killed = tuple[str, str, dict[str, Any]]


@pytest.fixture
def kill_in_window(sophos_env: SophosEnv, start_worker, start_api) -> Callable[..., Killed]:
    """``kill_in_window(message, SOPHOS_FAULT_KILL_..._CHECKPOINT=n) -> (api url, conversation, run)``:
    one message on a worker that kills itself at that checkpoint, then a fresh worker, which must
    report the run interrupted (``run`` is its ``GET /api/runs/{id}``)."""

    def kill(message: str, **fault: int) -> Killed:
        doomed = start_worker(sophos_env.with_(**fault))
        api = start_api(sophos_env)
        conversation, run = chat(api.url, message)
        assert doomed.wait(20) == -signal.SIGKILL

        start_worker(sophos_env)
        info = interrupted(api.url, run)
        assert info["status"] == "interrupted"
        assert "breakdown" not in info  # ended by recovery: no worker timed it
        return api.url, conversation, info

    return kill


async def test_kill_during_tool_then_resume_repeats_only_the_step_in_flight(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama, redis: Redis
) -> None:
    model.script(ToolCalls([("tools__slow", {"seconds": 1.5})]), Text("All done."))
    worker = start_worker(sophos_env)
    api = start_api(sophos_env)
    conversation, run = chat(api.url, "do the slow thing")

    wait_for(lambda: tool_calls(sophos_env.tools_log, "slow"), timeout=20)
    worker.kill()
    assert worker.wait(10) == -signal.SIGKILL
    assert model.calls == 1

    start_worker(sophos_env)
    info = interrupted(api.url, run)
    assert info["status"] == "interrupted" and info["error"]["code"] == "INTERRUPTED"
    stream = read_sse(api.url, conversation)
    assert stream[-1].event == "chat-error" and stream[-1].data["code"] == "INTERRUPTED"
    detail = get_json(api.url, f"/api/conversations/{conversation}")
    assert detail["resumable"] is True

    # arq will not run the job again behind the user's back, nor hold the conversation.
    assert await redis.zcard(QUEUE_NAME) == 0
    assert await redis.keys("arq:in-progress:*") == []
    assert await redis.hget(ACTIVE_RUNS, conversation) is None  # type: ignore[misc]  # redis-py's stubs

    _, resumed = chat(api.url, conversation=conversation, resume=True)
    assert resumed != run
    events = read_sse(api.url, conversation)
    assert events[-1].event == "end" and events[-1].data["run"] == resumed
    assert events.text == "All done."

    assert model.calls == 2  # the model call made before the kill was not made again
    assert len(tool_calls(sophos_env.tools_log, "slow")) == 2  # the step in flight ran once more
    detail = get_json(api.url, f"/api/conversations/{conversation}")
    assert [m["role"] for m in detail["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert detail["resumable"] is False
    assert [m["content"] for m in detail["messages"] if m["role"] == "user"] == ["do the slow thing"]

    again = post_chat(api.url, conversation=conversation, resume=True)
    assert again.status_code == 409 and again.json()["error"]["code"] == "RUN_NOT_RESUMABLE"


def test_killed_before_the_input_checkpoint_asks_to_send_again(
    kill_in_window: Callable[..., Killed], model: FakeOllama
) -> None:
    api_url, conversation, info = kill_in_window("will this be kept?", SOPHOS_FAULT_KILL_BEFORE_CHECKPOINT=1)
    assert "send it again" in info["error"]["message"]
    detail = get_json(api_url, f"/api/conversations/{conversation}")
    assert detail["messages"] == [] and detail["resumable"] is False
    assert model.calls == 0
    # The conversation is free: the message can be sent again at once.
    chat(api_url, "will this be kept?", conversation)
    assert read_sse(api_url, conversation)[-1].event == "end"


def test_killed_after_the_final_checkpoint_keeps_the_answer(
    kill_in_window: Callable[..., Killed], model: FakeOllama
) -> None:
    model.script(Text("The answer is kept."))
    # Checkpoints of a one-step run: input (1), after START (2), after the agent (3).
    api_url, conversation, _ = kill_in_window("answer me", SOPHOS_FAULT_KILL_AFTER_CHECKPOINT=3)
    detail = get_json(api_url, f"/api/conversations/{conversation}")
    assert detail["resumable"] is False
    assert [m["content"] for m in detail["messages"]] == ["answer me", "The answer is kept."]
    resume = post_chat(api_url, conversation=conversation, resume=True)
    assert resume.status_code == 409 and resume.json()["error"]["code"] == "RUN_NOT_RESUMABLE"
    assert model.calls == 1


def test_sigterm_drains_at_a_step_boundary_and_resume_finishes(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    hang = Hang(text="thinking ", then=ToolCalls([("tools__echo", {"text": "x"})]))
    model.script(hang, Text("Finished after restart."))
    worker = start_worker(sophos_env)
    api = start_api(sophos_env)
    conversation, run = chat(api.url, "take your time")
    hang.wait_started(15)

    worker.signal(signal.SIGTERM)
    worker.wait_for_log('"draining_runs": 1')  # the drain is requested while the model step runs
    hang.release()  # the model step completes; the drain stops before the tools step
    # Within SHUTDOWN_TIMEOUT (10 s here), plus 5 s for closing MCP sessions on a loaded machine;
    # and at the step boundary, not because the timeout cut the run short.
    assert worker.wait(15) == 0
    assert "worker.drain_timeout" not in worker.log_text()

    stream = read_sse(api.url, conversation)
    assert stream[-1].event == "chat-error" and stream[-1].data["code"] == "INTERRUPTED"
    assert get_json(api.url, f"/api/runs/{run}")["status"] == "interrupted"
    assert tool_calls(sophos_env.tools_log) == []
    assert worker.stray_descendants() == []  # MCP children closed

    start_worker(sophos_env)
    chat(api.url, conversation=conversation, resume=True)
    events = read_sse(api.url, conversation)
    assert events[-1].event == "end" and events.text == "Finished after restart."
    assert model.calls == 2
    assert len(tool_calls(sophos_env.tools_log, "echo")) == 1


def test_sigterm_while_idle_exits_at_once(sophos_env: SophosEnv, start_worker) -> None:
    worker = start_worker(sophos_env)
    started = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(10) == 0
    worker.wait_for_log('"draining_runs": 0')  # nothing to drain...
    # ...so it does not wait out SHUTDOWN_TIMEOUT (10 s here); the rest is closing time, generous
    # for a loaded machine.
    assert time.monotonic() - started < 8


def test_second_worker_on_the_same_database_refuses_to_start(
    sophos_env: SophosEnv, start_worker, backend: str
) -> None:
    if backend == "postgresql":
        pytest.skip("on PostgreSQL any number of workers share the database (tests/test_postgres.py)")
    start_worker(sophos_env)
    second = start_worker(sophos_env, wait_ready=False)
    assert second.wait(30) == 1
    assert "another worker" in second.log_text()


def test_bad_setting_stops_the_process_naming_the_variable(sophos_env: SophosEnv, start_worker, start_api):
    worker = start_worker(sophos_env.with_(AGENT_RECURSION_LIMIT="many"), wait_ready=False)
    assert worker.wait(30) == 2 and "AGENT_RECURSION_LIMIT" in worker.log_text()
    api = start_api(sophos_env.with_(REDIS_URL="localhost:6379"), wait_ready=False)
    assert api.wait(30) == 2 and "REDIS_URL" in api.log_text()


async def test_a_second_delivery_of_a_recorded_run_does_nothing(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    """arq delivers at least once: a job of a run already recorded must not run it again."""
    worker = start_worker(sophos_env)
    api = start_api(sophos_env)
    model.script(Text("only once"))
    conversation, run = chat(api.url, "say it once")
    assert read_sse(api.url, conversation).text == "only once"
    before = get_json(api.url, f"/api/runs/{run}")

    # The same job again, as arq would deliver it after losing track of the first delivery.
    job = RunJob(
        run_id=run, conversation_id=conversation, kind=JobKind.RUN, message="say it once",
        enqueued_at=time.time(),
    )
    redis = Redis.from_url(sophos_env.redis_url, decode_responses=True)
    try:
        assert await submit_run(redis, job, title="again") is None
        worker.wait_for_log(lambda line: run in line and "run.duplicate_delivery" in line, timeout=20)

        async def settled() -> bool:
            queued = await redis.zscore(QUEUE_NAME, run)
            return queued is None and not await redis.hexists(ACTIVE_RUNS, conversation)

        await wait_for_async(settled, message="the job gone and the conversation free")
    finally:
        await redis.aclose()
    assert model.calls == 1
    assert get_json(api.url, f"/api/runs/{run}") == before
    detail = get_json(api.url, f"/api/conversations/{conversation}")
    assert [m["role"] for m in detail["messages"]] == ["user", "assistant"]
    # The conversation goes on.
    model.script(Text("and again"))
    chat(api.url, "once more", conversation)
    assert read_sse(api.url, conversation).text == "and again"
