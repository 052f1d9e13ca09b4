"""``multitask_strategy="enqueue"`` (docs/agent-protocol.md): a run created on a busy thread waits in
the queue and starts when the run before it ends, driven by the real ``langgraph-sdk`` client against
a real API and worker with the fake model (scripted to answer slowly: a ``Hang`` released by the
test)."""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.errors import ConflictError
from langgraph_sdk.schema import Command
from redis.asyncio import Redis

from shared.contracts.jobs import DeleteJob, JobKind, RunJob, delete_claim
from shared.redis.keys import ACTIVE_RUNS, arq_in_progress_key, arq_job_key, taken_key, waiting_key
from shared.redis.queue import Submission, release_conversation, submit, submit_delete
from shared.redis.scripts import scripts
from tests.fakes.ollama import Drop, FakeOllama, Hang, Text, ToolCalls
from tests.support.agent_protocol import busy_thread, said
from tests.support.client import tool_calls, wait_for_async
from tests.support.env import SophosEnv
from tests.support.http import async_http_client
from tests.support.metrics import parse
from tests.support.stacks import approval_stack

APPROVE: Command = {"resume": {"decisions": [{"type": "approve"}]}}

#: the tests on the module's shared stack run in one xdist worker, which starts it once
shared_stack = pytest.mark.xdist_group("test_agent_protocol_enqueue")


async def enqueue(client: LangGraphClient, thread_id: str, text: str) -> dict[str, Any]:
    """A run with one user message, created with ``multitask_strategy="enqueue"``."""
    return dict(await client.runs.create(thread_id, "agent", input=said(text), multitask_strategy="enqueue"))


def texts(values: Any) -> list[str]:
    assert isinstance(values, dict)
    out = []
    for message in values["messages"]:
        content = message["content"]
        out.append(content if isinstance(content, str) else "".join(b.get("text", "") for b in content))
    return out


def last_user_message(request: dict[str, Any]) -> str:
    """What a run asked the model: the newest user message of its request."""
    return str([m for m in request["messages"] if m.get("role") == "user"][-1]["content"])


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, fake_ollama: FakeOllama) -> Iterator[SophosEnv]:
    """One API and worker for the tests that share them, on a Redis of their own. The fake tools
    server's ``add`` asks for approval."""
    with approval_stack(tmp_path_factory.mktemp("enqueue"), fake_ollama) as env:
        yield env


async def status_of(client: LangGraphClient, thread_id: str, run_id: str, *statuses: str) -> dict[str, Any]:
    """The run, once its status is one of ``statuses``."""
    async def reached() -> dict[str, Any] | None:
        run = dict(await client.runs.get(thread_id, run_id))
        return run if run["status"] in statuses else None

    return await wait_for_async(reached, timeout=30, message=f"run {run_id} {' or '.join(statuses)}")


def gauges(text: str) -> dict[str, float]:
    """The unlabelled samples of a /metrics scrape."""
    return {name: value for (name, labels), value in parse(text).items() if not labels}


@shared_stack
async def test_a_run_waiting_for_its_thread_is_not_the_workers_backlog(
    client: LangGraphClient, stack: SophosEnv, model: FakeOllama
) -> None:
    hang = Hang(text="A long answer.")
    model.script(hang, Text("Then this."))
    thread_id, _ = await busy_thread(client, hang)
    second = (await enqueue(client, thread_id, "two"))["run_id"]
    async with async_http_client(base_url=stack.api_url) as http:

        async def waited_a_second() -> bool:
            return int((await http.get(f"/api/runs/{second}")).json()["waitedMs"]) >= 1000

        await wait_for_async(waited_a_second, timeout=30, message="the enqueued run to wait a second")
        scraped = gauges((await http.get("/metrics")).text)
        # Queued, but waiting for its thread: not what SophosQueueBackingUp watches.
        assert scraped["sophos_runs_queued"] == 1
        assert scraped["sophos_runs_waiting_for_thread"] == 1
        assert scraped["sophos_queue_oldest_age_seconds"] == 0
        hang.release()
        await status_of(client, thread_id, second, "success")
        scraped = gauges((await http.get("/metrics")).text)
        assert scraped["sophos_runs_queued"] == scraped["sophos_runs_waiting_for_thread"] == 0


@shared_stack
async def test_an_enqueued_run_starts_when_the_run_before_it_ends(
    client: LangGraphClient, stack: SophosEnv, model: FakeOllama
) -> None:
    hang = Hang(text="First answer.")
    model.script(hang, Text("Second answer."))
    thread_id, first = await busy_thread(client, hang)

    second = await enqueue(client, thread_id, "two")
    assert second["status"] == "pending" and second["multitask_strategy"] == "enqueue"
    listed = {r["run_id"]: r["status"] for r in await client.runs.list(thread_id)}
    assert listed == {first: "running", second["run_id"]: "pending"}
    assert (await client.threads.get(thread_id))["status"] == "busy"
    # Everything else keeps the one-run-per-conversation rule: a new message on /api/chat, a
    # run with reject. (A delete cancels the runs, then deletes: tests/test_agent_protocol_defaults.py.)
    async with async_http_client(base_url=stack.api_url) as http:
        native = await http.post("/api/chat", json={"message": "three", "conversation": thread_id})
    assert native.status_code == 409 and native.json()["error"]["code"] == "SESSION_IN_PROGRESS"
    with pytest.raises(ConflictError):
        await client.runs.create(thread_id, "agent", input=said("three"), multitask_strategy="reject")
    with pytest.raises(ConflictError, match="waits for no decision"):  # decisions are never enqueued
        await client.runs.create(thread_id, "agent", command=APPROVE, multitask_strategy="enqueue")

    # runs.join on the pending run waits for its end, which comes after the first run's.
    joined = asyncio.create_task(client.runs.join(thread_id, second["run_id"]))
    assert (await client.runs.get(thread_id, second["run_id"]))["status"] == "pending"
    assert not joined.done()
    hang.release()
    values = await asyncio.wait_for(joined, 30)
    assert texts(values) == ["one", "First answer.", "two", "Second answer."]
    for run_id in (first, second["run_id"]):
        assert (await client.runs.get(thread_id, run_id))["status"] == "success"
    # The second run's model call had the first one's answer in its history.
    asked = model.requests[-1]["messages"]
    assert [m["content"] for m in asked if m["role"] != "system"] == ["one", "First answer.", "two"]
    assert (await client.threads.get(thread_id))["status"] == "idle"
    # On an idle thread it simply starts.
    model.script(Text("Idle answer."))
    values = await client.runs.wait(thread_id, "agent", input=said("idle"), multitask_strategy="enqueue")
    assert texts(values)[-2:] == ["idle", "Idle answer."]


@shared_stack
async def test_the_ending_wakes_the_next_run_on_a_redis_that_forgot_its_scripts(
    client: LangGraphClient, stack: SophosEnv, model: FakeOllama
) -> None:
    """A Redis restarted (or new) knows none of the scripts: the ending loads them and sends the
    wake of the next turn again, instead of losing it to "No matching script" (and leaving the
    waiting run to its 5 s fallback) (worker/run/outcome/ending.py)."""
    hang = Hang(text="First answer.")
    model.script(hang, Text("Second answer."))
    thread_id, _ = await busy_thread(client, hang)
    second = (await enqueue(client, thread_id, "two"))["run_id"]
    async with Redis.from_url(stack.redis_url) as redis:
        await redis.script_flush()
    hang.release()
    await status_of(client, thread_id, second, "success")
    logged = "".join(path.read_text() for path in (stack.root / "logs").glob("*.log"))
    assert "run.notify_along_failed" not in logged


@shared_stack
async def test_an_enqueued_run_starts_after_a_run_that_is_cancelled_or_fails(
    client: LangGraphClient, model: FakeOllama
) -> None:
    hang = Hang(text="Cut short")
    model.script(hang, Text("Answer two."))
    thread_id, first = await busy_thread(client, hang)
    second = await enqueue(client, thread_id, "two")
    await client.runs.cancel(thread_id, first, wait=True)
    assert (await client.runs.get(thread_id, first))["status"] == "interrupted"
    values = await client.runs.join(thread_id, second["run_id"])
    assert texts(values)[-2:] == ["two", "Answer two."]

    failing = Hang(text="Half", then=Drop())  # the model's connection cut: the run fails
    model.script(failing, Text("Answer four."))
    third = await client.runs.create(thread_id, "agent", input=said("three"))
    await failing.wait_started_async(20)
    fourth = await enqueue(client, thread_id, "four")
    failing.release()
    values = await client.runs.join(thread_id, fourth["run_id"])
    assert (await client.runs.get(thread_id, third["run_id"]))["status"] == "error"
    assert (await client.runs.get(thread_id, fourth["run_id"]))["status"] == "success"
    assert texts(values)[-2:] == ["four", "Answer four."]


@shared_stack
async def test_three_enqueued_runs_start_in_the_order_they_were_accepted(
    client: LangGraphClient, model: FakeOllama
) -> None:
    hang = Hang(text="First answer.")
    model.script(hang, Text("Answer two."), Text("Answer three."), Text("Answer four."))
    thread_id, first = await busy_thread(client, hang)
    queued = [(await enqueue(client, thread_id, text))["run_id"] for text in ("two", "three", "four")]
    assert [r["status"] for r in await client.runs.list(thread_id)] == ["pending"] * 3 + ["running"]
    hang.release()
    values = await client.runs.join(thread_id, queued[-1])
    assert texts(values) == [
        "one", "First answer.", "two", "Answer two.", "three", "Answer three.", "four", "Answer four.",
    ]
    assert [last_user_message(r) for r in model.requests] == ["one", "two", "three", "four"]
    for run_id in (first, *queued):
        assert (await client.runs.get(thread_id, run_id))["status"] == "success"


@shared_stack
async def test_a_cancelled_pending_run_never_runs(
    client: LangGraphClient, stack: SophosEnv, model: FakeOllama
) -> None:
    hang = Hang(text="First answer.")
    model.script(hang, Text("After the cancel."))
    thread_id, _ = await busy_thread(client, hang)
    never = await enqueue(client, thread_id, "never")
    taken = await enqueue(client, thread_id, "taken")
    after = await enqueue(client, thread_id, "after")

    await client.runs.cancel(thread_id, never["run_id"])
    assert (await client.runs.get(thread_id, never["run_id"]))["status"] == "interrupted"
    # A waiting run is taken by the worker for an instant each time its turn is looked at (with
    # several runs at once): the cancel waits for it to be back in the queue, and it never starts.
    async with Redis.from_url(stack.redis_url) as redis:
        await redis.set(arq_in_progress_key(taken["run_id"]), "1", px=300)  # as the worker's take
        await client.runs.cancel(thread_id, taken["run_id"])
    assert (await client.runs.get(thread_id, taken["run_id"]))["status"] == "interrupted"
    hang.release()
    values = await client.runs.join(thread_id, after["run_id"])
    assert texts(values) == ["one", "First answer.", "after", "After the cancel."]
    assert [last_user_message(r) for r in model.requests] == ["one", "after"]
    for cancelled in (never, taken):
        assert (await client.runs.get(thread_id, cancelled["run_id"]))["status"] == "interrupted"
    assert (await client.runs.get(thread_id, after["run_id"]))["status"] == "success"
    ended = [p async for p in client.runs.join_stream(thread_id, never["run_id"], last_event_id="-1")]
    assert ended[-1].event == "end" and ended[-1].data["status"] == "interrupted"
    assert "error" not in [p.event for p in ended]  # cancelled, never started: no error


@shared_stack
async def test_an_enqueued_message_behind_a_run_that_ends_waiting_for_an_approval_fails(
    client: LangGraphClient, stack: SophosEnv, model: FakeOllama
) -> None:
    hang = Hang(then=ToolCalls([("tools__add", {"a": 2, "b": 3})]))
    model.script(hang, Text("The sum is 5."))
    thread_id, first = await busy_thread(client, hang)
    behind = await enqueue(client, thread_id, "meanwhile")
    hang.release()

    refused = await status_of(client, thread_id, behind["run_id"], "error", "success", "interrupted")
    assert refused["status"] == "error"
    assert (await client.runs.get(thread_id, first))["status"] == "success"  # paused at its approval
    # Never recorded (no row), yet listed as its Redis record says: an error.
    listed = [(r["run_id"], r["status"]) for r in await client.runs.list(thread_id)]
    assert listed == [(behind["run_id"], "error"), (first, "success")]
    assert [r["run_id"] for r in await client.runs.list(thread_id, status="error")] == [behind["run_id"]]
    events = [p async for p in client.runs.join_stream(thread_id, behind["run_id"], last_event_id="-1")]
    assert [p.event for p in events[-2:]] == ["error", "end"] and events[-1].data["status"] == "error"
    assert events[-2].data["error"] == "APPROVAL_PENDING" and "decision" in events[-2].data["message"]
    # The approval is still pending, and the message was never recorded.
    thread = await client.threads.get(thread_id)
    assert thread["status"] == "interrupted" and len(thread["interrupts"]) == 1
    state = await client.threads.get_state(thread_id)
    assert state["next"] == ["approval"] and "meanwhile" not in texts(state["values"])
    assert model.calls == 1 and tool_calls(stack.tools_log, "add") == []
    done = await client.runs.wait(thread_id, "agent", command=APPROVE)
    assert texts(done)[-1] == "The sum is 5." and "meanwhile" not in texts(done)
    assert len(tool_calls(stack.tools_log, "add")) == 1


@shared_stack
async def test_an_enqueued_resume_that_finds_nothing_to_resume_fails(
    client: LangGraphClient, model: FakeOllama
) -> None:
    hang = Hang(text="First answer.")
    model.script(hang)
    thread_id, first = await busy_thread(client, hang)
    resume = dict(await client.runs.create(thread_id, "agent", multitask_strategy="enqueue"))  # no input
    assert resume["status"] == "pending"
    hang.release()
    refused = await status_of(client, thread_id, resume["run_id"], "error", "success", "interrupted")
    assert refused["status"] == "error"
    events = [p async for p in client.runs.join_stream(thread_id, resume["run_id"], last_event_id="-1")]
    assert events[-2].event == "error" and events[-2].data["error"] == "RUN_NOT_RESUMABLE"
    assert (await client.runs.get(thread_id, first))["status"] == "success"
    thread = await client.threads.get(thread_id)
    assert thread["status"] == "idle" and texts(thread["values"]) == ["one", "First answer."]
    assert model.calls == 1


async def test_enqueued_runs_keep_their_order_when_the_worker_takes_them_early(
    sophos_env: SophosEnv, start_worker: Any, start_api: Any, model: FakeOllama
) -> None:
    """With two runs at once, the worker takes the waiting runs' jobs while the first run holds
    the thread, and defers them: still they start one at a time, in the order accepted."""
    env = sophos_env.with_(WORKER_CONCURRENCY=2)
    hang = Hang(text="First answer.")
    model.script(hang, Text("Answer two."), Text("Answer three."), Text("Answer four."))
    start_worker(env)
    api = start_api(env)
    async with get_client(url=api.url) as client:
        thread_id, first = await busy_thread(client, hang)
        queued = [(await enqueue(client, thread_id, text))["run_id"] for text in ("two", "three", "four")]
        hang.release()
        values = await client.runs.join(thread_id, queued[-1])
        assert texts(values) == [
            "one", "First answer.", "two", "Answer two.", "three", "Answer three.", "four", "Answer four.",
        ]
        assert [last_user_message(r) for r in model.requests] == ["one", "two", "three", "four"]
        for run_id in (first, *queued):
            assert (await client.runs.get(thread_id, run_id))["status"] == "success"


async def test_a_run_queued_behind_a_killed_run_still_runs(
    sophos_env: SophosEnv, start_worker: Any, start_api: Any, model: FakeOllama
) -> None:
    """The worker and the API are both killed (SIGKILL) while a run waits: it waited in Redis."""
    hang = Hang(text="half an ")
    model.script(hang, Text("Second answer."))
    worker = start_worker(sophos_env)
    api = start_api(sophos_env)
    async with get_client(url=api.url) as client:
        thread_id, first = await busy_thread(client, hang)
        second = await enqueue(client, thread_id, "two")
        api.kill()
        worker.kill()
        assert worker.wait(10) == -signal.SIGKILL and api.wait(10) == -signal.SIGKILL

        start_api(sophos_env)
        assert (await client.runs.get(thread_id, second["run_id"]))["status"] == "pending"
        start_worker(sophos_env)
        crashed = await status_of(client, thread_id, first, "interrupted", "error", "success")
        assert crashed["status"] == "interrupted"  # the crash semantics: not re-run behind the user's back
        values = await client.runs.join(thread_id, second["run_id"])
        assert (await client.runs.get(thread_id, second["run_id"]))["status"] == "success"
        assert texts(values) == ["one", "two", "Second answer."]
        assert [last_user_message(r) for r in model.requests] == ["one", "two"]


async def test_a_waiting_run_holds_the_conversation_until_its_turn(redis: Redis) -> None:
    """The scripts alone (shared/redis/queue.py, worker/run/turns.py): between the end of the run holding a
    conversation and the turn of the run waiting behind it, nothing overtakes the waiting run;
    and a waiting run whose job is gone (arq dropped it) holds nothing back."""
    conversation = str(uuid.uuid4())

    def job(*, may_wait: bool = False) -> RunJob:
        return RunJob(
            run_id=str(uuid.uuid4()), conversation_id=conversation, kind=JobKind.RUN, message="hi",
            enqueued_at=time.time(), may_wait=may_wait,
        )

    async def turn(run: RunJob) -> list[str]:
        return list(await scripts(redis).claim_turn(
            keys=[ACTIVE_RUNS, waiting_key(conversation), taken_key(run.run_id)],
            args=[conversation, run.run_id, "", 60],
        ))

    first, waiting, later = job(), job(may_wait=True), job(may_wait=True)
    assert await submit(redis, first, title="t") == Submission()  # accepted, with the claim
    assert (await submit(redis, waiting, title="t", enqueue=True)).behind == first.run_id
    assert (await submit(redis, later, title="t", enqueue=True)).behind == first.run_id
    assert await turn(waiting) == ["behind", first.run_id]
    assert await release_conversation(redis, conversation, first.run_id)  # the first run ended

    # The conversation is free of claims, but runs still wait: a message, a delete, a run with
    # the default strategy are refused, naming the first run waiting.
    assert (await submit(redis, job(), title="t")).holder == waiting.run_id
    deletion = DeleteJob(conversation, delete_claim(str(uuid.uuid4())), time.time())
    assert await submit_delete(redis, deletion) == waiting.run_id
    assert await turn(later) == ["behind", waiting.run_id]  # the earlier one comes first
    assert await turn(waiting) == ["claimed"]
    assert await redis.hget(ACTIVE_RUNS, conversation) == waiting.run_id
    assert await redis.lrange(waiting_key(conversation), 0, -1) == [later.run_id]
    assert await turn(waiting) == ["held"]  # a second delivery: it holds it already

    # A waiting run whose job arq dropped: it never runs, and is no holder.
    assert await release_conversation(redis, conversation, waiting.run_id)
    await redis.delete(arq_job_key(later.run_id))
    assert (await submit(redis, job(), title="t")).holder is None
    assert await redis.exists(waiting_key(conversation)) == 0

    # A conversation being deleted is never waited behind.
    conversation = str(uuid.uuid4())
    deletion = DeleteJob(conversation, delete_claim(str(uuid.uuid4())), time.time())
    assert await submit_delete(redis, deletion) is None
    assert (await submit(redis, job(may_wait=True), title="t", enqueue=True)).holder == deletion.claim
    assert await redis.exists(waiting_key(conversation)) == 0
