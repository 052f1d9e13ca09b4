"""A run ends in one place (worker/run/outcome/ending.py): a pending interrupt means ``waiting``, whatever
ended it.

Real worker, API, Redis, SQLite and the fake tools server. Each test fails on the
code before the ending was one: the approval was lost when the decision's run did
not get as far as its approval node's checkpoint, and new input over a pending
interrupt silently discarded it.
"""

from __future__ import annotations

import signal
import time
import uuid

import httpx
from redis.asyncio import Redis

from shared.contracts.jobs import JobKind, RunJob
from shared.redis.keys import cancel_key
from shared.redis.queue import submit_run
from tests.fakes.ollama import FakeOllama, Hang, Text, ToolCalls
from tests.support.client import chat, get_json, read_sse, tool_calls, wait_for, wait_for_async
from tests.support.env import SophosEnv, require_approval
from tests.support.http import async_http_client
from tests.test_approvals import decide, wait_approval


async def test_a_decision_run_cancelled_before_it_acted_leaves_the_approval_pending(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama, redis: Redis
) -> None:
    """The decision's run is cancelled after its worker took it, before its graph started.

    The interrupt is still pending in the thread. Before: the run was recorded
    ``cancelled``, the conversation no longer ``waiting``, and every later decision got
    409 NO_APPROVAL_PENDING (and resume RUN_NOT_RESUMABLE): the approval was lost.
    """
    require_approval(sophos_env, ["add"])
    worker = start_worker(sophos_env)
    start_api(sophos_env)
    model.script(ToolCalls([("tools__add", {"a": 1, "b": 2})]), Text("3."))
    conversation, _ = chat(sophos_env.api_url, "add 1 and 2")
    [request] = wait_approval(sophos_env.api_url, conversation)
    worker.signal(signal.SIGSTOP)  # it takes the decision only after the cancel
    try:
        accepted = decide(sophos_env.api_url, conversation, [{"id": request["id"], "action": "approve"}])
        assert accepted.status_code == 202, accepted.text
        decided = accepted.json()["run"]
        # The cancel of a run its worker took: the marker (its signal missed).
        await redis.set(cancel_key(decided), "{}")
    finally:
        worker.signal(signal.SIGCONT)

    events = read_sse(sophos_env.api_url, conversation)
    assert events[-1].data["run"] == decided
    assert events.types[-2:] == ["approval", "end"], events.types
    assert events[-1].data["status"] == "waiting"
    assert events.of("approval")[0].data["requests"] == [request]
    assert get_json(sophos_env.api_url, f"/api/runs/{decided}")["status"] == "waiting"
    detail = get_json(sophos_env.api_url, f"/api/conversations/{conversation}")
    assert detail["conversation"]["status"] == "waiting"
    assert detail["pendingApproval"] == [request]
    assert tool_calls(sophos_env.tools_log, "add") == []

    again = decide(sophos_env.api_url, conversation, [{"id": request["id"], "action": "approve"}])
    assert again.status_code == 202, again.text
    wait_for(lambda: read_sse(sophos_env.api_url, conversation)[-1].data["status"] == "completed", 30)
    assert [c["args"] for c in tool_calls(sophos_env.tools_log, "add")] == [{"a": 1, "b": 2}]


async def test_the_worker_refuses_a_message_over_a_pending_interrupt(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama, redis: Redis
) -> None:
    """A message that reached the queue while the conversation turned ``waiting`` (the API's
    check raced the run's end) is refused by the worker: the approval stays, nothing runs.

    Before: the new input started a new step over the interrupt, silently discarding it.
    """
    require_approval(sophos_env, ["add"])
    start_worker(sophos_env)
    start_api(sophos_env)
    model.script(ToolCalls([("tools__add", {"a": 5, "b": 6})]), Text("11."), Text("over the approval"))
    conversation, _ = chat(sophos_env.api_url, "add 5 and 6")
    [request] = wait_approval(sophos_env.api_url, conversation)
    model_calls = len(model.requests)

    # Past the API's checks, as a request that read the conversation before it turned waiting.
    job = RunJob(
        run_id=str(uuid.uuid4()), conversation_id=conversation, kind=JobKind.RUN,
        message="something else", enqueued_at=time.time(),
    )
    assert await submit_run(redis, job, title="race") is None

    async def ended() -> bool:
        run = get_json(sophos_env.api_url, f"/api/runs/{job.run_id}")
        return run["status"] not in ("queued", "running")

    await wait_for_async(ended, timeout=30, message="the raced run's end")
    run = get_json(sophos_env.api_url, f"/api/runs/{job.run_id}")
    assert run["status"] == "waiting", run
    assert run["error"]["code"] == "APPROVAL_PENDING", run
    assert len(model.requests) == model_calls  # the model was not called
    detail = get_json(sophos_env.api_url, f"/api/conversations/{conversation}")
    assert detail["conversation"]["status"] == "waiting"
    assert detail["pendingApproval"] == [request]
    assert "something else" not in [m["content"] for m in detail["messages"]]
    events = read_sse(sophos_env.api_url, conversation)
    assert events.types[-2:] == ["approval", "end"], events.types

    accepted = decide(sophos_env.api_url, conversation, [{"id": request["id"], "action": "approve"}])
    assert accepted.status_code == 202, accepted.text
    wait_for(lambda: read_sse(sophos_env.api_url, conversation)[-1].data["status"] == "completed", 30)
    assert [c["args"] for c in tool_calls(sophos_env.tools_log, "add")] == [{"a": 5, "b": 6}]



async def test_a_switch_cancelled_before_it_started_records_the_branch_it_follows(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama, redis: Redis
) -> None:
    """A ``switch`` run (back to an older branch) cancelled after its worker took it: the
    conversation follows that branch from the run's start, and its ending reads that branch.

    Before: the ending read the thread's newest checkpoint, the branch left behind, and
    recorded its message count (6) beside the 4 messages the conversation shows.
    """
    url = sophos_env.api_url
    worker = start_worker(sophos_env)
    start_api(sophos_env)
    model.script(Text("A1"), Text("A2"), Text("B2"), Text("B3"))

    def said(conversation: str | None, message: str, **extra: str) -> str:
        response = httpx.post(f"{url}/api/chat", json={
            **({"conversation": conversation} if conversation else {}), "message": message, **extra,
        }, timeout=30, trust_env=False)
        assert response.status_code == 202, response.text
        conversation = str(response.json()["conversation"])
        assert read_sse(url, conversation)[-1].data["status"] == "completed"
        return conversation

    conversation = said(None, "one")
    said(conversation, "two")
    shown = get_json(url, f"/api/conversations/{conversation}")["messages"]
    two = next(m for m in shown if m["content"] == "two")
    said(conversation, "two, edited", replaces=two["id"])  # a new branch, the thread's newest
    said(conversation, "three")
    assert get_json(url, f"/api/conversations/{conversation}")["conversation"]["messageCount"] == 6

    worker.signal(signal.SIGSTOP)  # it takes the switch only after the cancel
    try:
        async with async_http_client(base_url=url, timeout=30) as http:
            response = await http.post(f"/api/conversations/{conversation}/branch",
                                       json={"message": two["id"]})
        assert response.status_code == 202, response.text
        await redis.set(cancel_key(response.json()["run"]), "{}")
    finally:
        worker.signal(signal.SIGCONT)
    assert read_sse(url, conversation)[-1].data["status"] == "cancelled"
    detail = get_json(url, f"/api/conversations/{conversation}")
    assert [m["content"] for m in detail["messages"]] == ["one", "A1", "two", "A2"]
    assert detail["conversation"]["messageCount"] == 4


def test_sigterm_past_shutdown_timeout_ends_the_run_before_the_worker_exits(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    """The step in flight does not reach a boundary within SHUTDOWN_TIMEOUT: the worker ends
    the run itself (``interrupted``, its terminal event written) before it closes its stores."""
    hang = Hang(text="a long ")
    model.script(hang, Text("Finished after restart."))
    worker = start_worker(sophos_env.with_(SHUTDOWN_TIMEOUT=1))
    start_api(sophos_env)
    conversation, run = chat(sophos_env.api_url, "take longer than the shutdown allows")
    hang.wait_started(15)
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    assert "worker.runs_abandoned" in worker.log_text()

    info = get_json(sophos_env.api_url, f"/api/runs/{run}")
    assert info["status"] == "interrupted" and "SHUTDOWN_TIMEOUT" in info["error"]["message"], info
    stream = read_sse(sophos_env.api_url, conversation)
    assert stream[-1].event == "chat-error" and stream[-1].data["code"] == "INTERRUPTED"
    assert get_json(sophos_env.api_url, f"/api/conversations/{conversation}")["resumable"] is True

    start_worker(sophos_env)
    chat(sophos_env.api_url, conversation=conversation, resume=True)
    assert read_sse(sophos_env.api_url, conversation).text == "Finished after restart."
