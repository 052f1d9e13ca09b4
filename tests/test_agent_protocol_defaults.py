"""The Agent Server's defaults and shapes (docs/agent-protocol.md, "A client written for the Agent
Server works unchanged"), each driven by the real ``langgraph-sdk`` client against a real API and
worker with the fake model, on one stack for the module: a second run on a busy thread waits,
deleting a busy thread cancels its runs, ``cancel?wait=1`` answers the values, an unknown cancel
action interrupts, a join from the start begins with ``metadata``, concurrent creates of one
thread keep its metadata, ``/openapi.json``, the counts, what of the thread streams is refused by
name, and the bounds on run creation (the submission rate limit, the waiting list's cap)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.errors import ConflictError, NotFoundError
from redis.asyncio import Redis
from websockets.exceptions import ConnectionClosed

from api.protocol.runs.service import MAX_WAITING_RUNS
from shared.redis.keys import QUEUE_NAME
from tests.fakes.ollama import FakeOllama, Hang, Text, ToolCalls
from tests.support.agent_protocol import busy_thread, said
from tests.support.client import wait_for_async
from tests.support.env import SophosEnv
from tests.support.http import async_http_client
from tests.support.stacks import approval_stack
from worker.run.turns import TURN_RETRY_SECONDS

shared_stack = pytest.mark.xdist_group("test_agent_protocol_defaults")


def texts(values: Any) -> list[str]:
    assert isinstance(values, dict)
    return [
        m["content"] if isinstance(m["content"], str) else "".join(b.get("text", "") for b in m["content"])
        for m in values["messages"]
    ]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, fake_ollama: FakeOllama) -> Iterator[SophosEnv]:
    # Two runs at once: a run waiting for its thread is taken early and deferred (worker/run/turns.py).
    with approval_stack(tmp_path_factory.mktemp("defaults"), fake_ollama, WORKER_CONCURRENCY="2") as env:
        yield env


@shared_stack
async def test_a_second_run_on_a_busy_thread_waits_its_turn_by_default(
    client: LangGraphClient, model: FakeOllama
) -> None:
    hang = Hang(text="First answer.")
    model.script(hang, Text("Second answer."))
    thread_id, first = await busy_thread(client, hang)
    second = await client.runs.create(thread_id, "agent", input=said("two"))  # no multitask_strategy
    assert second["status"] == "pending" and second["multitask_strategy"] == "enqueue"
    # A fork waits for no one: without a strategy it is reject.
    checkpoint = (await client.threads.get_history(thread_id, limit=1))[0]["checkpoint"]["checkpoint_id"]
    with pytest.raises(ConflictError):
        await client.runs.create(thread_id, "agent", input=said("fork"), checkpoint_id=checkpoint)
    hang.release()
    values = await client.runs.join(thread_id, second["run_id"])
    assert texts(values) == ["one", "First answer.", "two", "Second answer."]
    assert (await client.runs.get(thread_id, first))["status"] == "success"


@shared_stack
async def test_a_waiting_run_is_woken_when_the_run_ahead_ends(
    client: LangGraphClient, stack: SophosEnv, model: FakeOllama
) -> None:
    """Taken early and deferred for ``TURN_RETRY_SECONDS`` (5 s), the waiting run starts as soon
    as the run ahead ends: the ending wakes it."""
    hang = Hang(text="First answer.")
    model.script(hang, Text("Second answer."))
    thread_id, first = await busy_thread(client, hang)
    second = (await client.runs.create(thread_id, "agent", input=said("two")))["run_id"]
    async with Redis.from_url(stack["REDIS_URL"]) as redis:

        async def deferred() -> bool:
            due = await redis.zscore(QUEUE_NAME, second)
            return due is not None and due > time.time() * 1000 + 1000

        await wait_for_async(deferred, timeout=10, message="the waiting run's job taken and deferred")
    hang.release()
    await client.runs.join(thread_id, second)
    async with async_http_client(base_url=stack.api_url) as http:
        ahead = (await http.get(f"/api/runs/{first}")).json()
        behind = (await http.get(f"/api/runs/{second}")).json()
    waited = (datetime.fromisoformat(behind["startedAt"]) - datetime.fromisoformat(ahead["finishedAt"]))
    assert waited.total_seconds() < TURN_RETRY_SECONDS / 2, f"started {waited} after the run ahead ended"


@shared_stack
async def test_deleting_a_busy_thread_cancels_its_runs_then_deletes_it(
    client: LangGraphClient, model: FakeOllama
) -> None:
    hang = Hang(text="Never finished")
    model.script(hang)
    thread_id, first = await busy_thread(client, hang)
    waiting = await client.runs.create(thread_id, "agent", input=said("two"))
    assert waiting["status"] == "pending"
    await client.threads.delete(thread_id)
    with pytest.raises(NotFoundError):
        await client.threads.get(thread_id)
    with pytest.raises(NotFoundError):
        await client.runs.get(thread_id, first)
    assert model.calls == 1  # the waiting run never ran


@shared_stack
async def test_cancel_with_wait_answers_the_values_and_an_unknown_action_interrupts(
    client: LangGraphClient, model: FakeOllama
) -> None:
    hang = Hang(text="Thinking about it")
    model.script(hang)
    thread_id, run_id = await busy_thread(client, hang)
    async for part in client.runs.join_stream(thread_id, run_id, stream_mode="messages-tuple"):
        if part.event == "messages":
            break  # its first token is out: the cancel keeps it
    action: Any = "cancel"  # not one of the SDK's two: the Agent Server reads it as interrupt
    values = await client.runs.cancel(thread_id, run_id, wait=True, action=action)
    assert texts(values) == ["one", "Thinking about it"]
    assert (await client.runs.get(thread_id, run_id))["status"] == "interrupted"


@shared_stack
async def test_a_join_from_the_start_begins_with_metadata(
    client: LangGraphClient, stack: SophosEnv, model: FakeOllama
) -> None:
    model.script(Text("Joined."))
    thread_id = (await client.threads.create())["thread_id"]
    run = await client.runs.create(thread_id, "agent", input=said("hello"))
    whole = [p async for p in client.runs.join_stream(thread_id, run["run_id"], last_event_id="-1")]
    assert whole[0].event == "metadata" and whole[0].data["run_id"] == run["run_id"]
    assert [p.event for p in whole[-2:]] == ["values", "end"]
    unnamed = [p async for p in client.runs.join_stream(thread_id, run["run_id"])]  # no Last-Event-ID
    assert unnamed[0].event == "metadata"
    # A rejoin after an event goes on from it: no metadata again.
    async with async_http_client(base_url=stack.api_url) as http, http.stream(
        "GET", f"/threads/{thread_id}/runs/{run['run_id']}/stream", headers={"Last-Event-ID": "1-0"}
    ) as response:
        body = (await response.aread()).decode()
    assert "event: metadata" not in body and "event: end" in body


@shared_stack
async def test_concurrent_creates_of_one_thread_id_all_answer_its_metadata(client: LangGraphClient) -> None:
    for _ in range(5):
        thread_id = str(uuid.uuid4())
        answers = await asyncio.gather(*(
            client.threads.create(thread_id=thread_id, metadata={"topic": "races"}, if_exists="do_nothing")
            for _ in range(12)
        ))
        assert {a["metadata"].get("topic") for a in answers} == {"races"}


@shared_stack
async def test_openapi_json_and_the_counts(
    client: LangGraphClient, stack: SophosEnv, model: FakeOllama
) -> None:
    async with async_http_client(base_url=stack.api_url) as http:
        served = await http.get("/openapi.json")  # public, as /schema/openapi.json is
        assert served.status_code == 200
        assert served.json() == (await http.get("/schema/openapi.json")).json()
        assert "/threads/{thread_id}/runs/stream" in served.json()["paths"]
    assert await client.assistants.count() == 1
    assert await client.assistants.count(graph_id="agent") == 1
    assert await client.assistants.count(graph_id="other") == 0
    tag = str(uuid.uuid4())
    for _ in range(3):
        await client.threads.create(metadata={"tag": tag})
    assert await client.threads.count(metadata={"tag": tag}) == 3
    assert await client.threads.count(metadata={"tag": tag}, status="busy") == 0
    assert await client.threads.count(metadata={"tag": "none such"}) == 0


@shared_stack
async def test_a_threads_waiting_list_is_capped(client: LangGraphClient, model: FakeOllama) -> None:
    hang = Hang(text="Holding the thread")
    model.script(hang)
    thread_id, _ = await busy_thread(client, hang)
    for i in range(MAX_WAITING_RUNS):
        assert (await client.runs.create(thread_id, "agent", input=said(f"wait {i}")))["status"] == "pending"
    with pytest.raises(ConflictError) as refused:
        await client.runs.create(thread_id, "agent", input=said("one too many"))
    error = refused.value.response.json()["error"]
    assert error["code"] == "WAITING_LIST_FULL" and f"at most {MAX_WAITING_RUNS}" in error["message"]
    assert len(await client.runs.list(thread_id, limit=100)) == MAX_WAITING_RUNS + 1
    await client.threads.delete(thread_id)  # the holder and every waiting run cancelled first
    assert model.calls == 1


@shared_stack
async def test_run_creation_counts_against_the_submission_rate_limit(stack: SophosEnv) -> None:
    """The limit of ``POST /api/chat`` (``RATE_LIMIT_PER_MINUTE``, 60 here) counts every way to
    create a run, per client address (X-Forwarded-For from a trusted proxy, loopback here)."""
    headers = {"X-Forwarded-For": "192.0.2.41"}
    async with get_client(url=stack.api_url, headers=headers) as sdk, \
            async_http_client(base_url=stack.api_url, headers=headers) as http:
        thread_id = (await sdk.threads.create())["thread_id"]
        body = {"assistant_id": "no such assistant", "input": said("x")}
        for i in range(60):  # refused (an unknown assistant), but counted all the same
            route = ("runs", "runs/stream", "runs/wait")[i % 3]
            assert (await http.post(f"/threads/{thread_id}/{route}", json=body)).status_code == 404
        for route in ("runs", "runs/stream", "runs/wait"):
            answer = await http.post(f"/threads/{thread_id}/{route}", json={**body, "assistant_id": "agent"})
            assert answer.status_code == 429 and answer.json()["error"]["code"] == "RATE_LIMITED"
            assert 1 <= int(answer.headers["Retry-After"]) <= 60
        native = await http.post("/api/chat", json={"message": "hi"})
        assert native.status_code == 429  # the one limit, shared with /api/chat
        started = await http.post(f"/threads/{thread_id}/commands", json={
            "id": 1, "method": "run.start", "params": {"assistant_id": "agent", "input": said("x")}})
        assert started.status_code == 429  # and with threads.stream's commands
        assert await sdk.runs.list(thread_id) == []  # nothing created
        assert (await sdk.threads.get(thread_id))["status"] == "idle"


@shared_stack
async def test_values_are_streamed_after_every_step_by_default(
    client: LangGraphClient, model: FakeOllama
) -> None:
    """``values`` is the SDK's default stream mode: the state after each step, then at the end;
    a rejoin from the start gets the same states (read from the run's checkpoints)."""
    model.script(Text("Warming up."))
    thread_id = (await client.threads.create())["thread_id"]
    await client.runs.wait(thread_id, "agent", input=said("first"))
    model.script(ToolCalls([("tools__echo", {"text": "ping"})]), Text("Echoed."))
    parts = [p async for p in client.runs.stream(thread_id, "agent", input=said("echo ping"))]
    assert parts[0].event == "metadata" and parts[-1].event == "end"
    values = [p for p in parts if p.event == "values"]
    kinds = [[m["type"] for m in v.data["messages"]] for v in values]
    before = ["human", "ai"]
    assert kinds == [  # (kinds shown on a failure)
        [*before, "human"],                      # its input taken
        [*before, "human", "ai"],                # the model's turn: a tool call
        [*before, "human", "ai", "tool"],        # the tool's result
        [*before, "human", "ai", "tool", "ai"],  # the answer: the run's end
    ]
    assert texts(values[-1].data)[-1] == "Echoed."
    run_id = parts[0].data["run_id"]
    replay = [p async for p in client.runs.join_stream(thread_id, run_id, last_event_id="-1")]
    assert [(p.id, p.data) for p in replay if p.event == "values"] == [(v.id, v.data) for v in values]


@shared_stack
async def test_streamed_messages_carry_the_ids_they_are_stored_under(
    client: LangGraphClient, model: FakeOllama
) -> None:
    """A UI merging streamed chunks with the thread's state by id sees each message once."""
    model.script(ToolCalls([("tools__echo", {"text": "ping"})]), Text("Echoed it."))
    thread_id = (await client.threads.create())["thread_id"]
    parts = [p async for p in client.runs.stream(
        thread_id, "agent", input=said("echo ping"), stream_mode=["messages-tuple", "updates", "values"],
    )]
    stored = {m["id"]: m["type"] for m in [p.data for p in parts if p.event == "values"][-1]["messages"]}
    streamed = {p.data[0]["id"] for p in parts if p.event == "messages"}
    updated = {
        m["id"] for p in parts if p.event == "updates" for node in p.data.values() for m in node["messages"]
    }
    assert streamed <= set(stored) and updated <= set(stored)
    assert sorted(stored[i] for i in updated) == ["ai", "ai", "tool"]  # both answers and the result
    assert {stored[i] for i in streamed} == {"ai", "tool"}


async def _all(items: Any) -> list[Any]:
    return [item async for item in items]


async def answers(messages: Any) -> list[str]:
    """The texts of a session's ``thread.messages`` (iterated whole first: iterating feeds them)."""
    return [str(await m.text) for m in [m async for m in messages]]


#: How long any one wait of the session test may take (a run here takes well under a second): the
#: SDK's own read timeout is 300 s, so an unbounded wait that misses its run held CI for ten minutes.
SESSION_WAIT = 60


async def subscribed(projection: Any) -> asyncio.Future[list[str]]:
    """``answers(projection)``, subscribed before the caller starts a run: the SDK ends a projection
    such as ``thread.messages`` on a run's terminal lifecycle event, and one that subscribes after a
    fast run has ended waits for the next run's (it registers its subscription before its first
    await, so one turn of the loop is enough)."""
    reading = asyncio.ensure_future(answers(projection))
    await asyncio.sleep(0)
    return reading


async def within(awaitable: Any) -> Any:
    return await asyncio.wait_for(awaitable, timeout=SESSION_WAIT)


@shared_stack
async def test_the_sdks_thread_streaming_session(
    client: LangGraphClient, stack: SophosEnv, model: FakeOllama
) -> None:
    """``client.threads.stream`` (docs/agent-protocol.md "The thread streaming session"): runs
    started and answered through the session, their messages and values streamed back. Every
    projection is subscribed before its run starts, as a client that wants all of it must, and
    every wait is bounded, so a regression fails instead of holding the suite."""
    thread_id = (await client.threads.create())["thread_id"]
    model.script(Text("Hello there."))
    async with client.threads.stream(thread_id, assistant_id="agent") as thread:
        replies = await subscribed(thread.messages)
        started = await within(thread.run.start(input=said("hi")))
        assert await within(replies) == ["Hello there."]
        assert texts(await within(thread.output)) == ["hi", "Hello there."]
        run = await client.runs.get(thread_id, started["run_id"])
        assert run["status"] == "success"

        # A second run on the same session: its values, after each step, end with its answer.
        model.script(Text("Again."))
        values_of_run = aiter(thread.values)
        current = await within(anext(values_of_run))  # the thread's values now: subscribed
        assert texts(current) == ["hi", "Hello there."]
        await within(thread.run.start(input=said("again")))
        values = await within(_all(values_of_run))
        assert texts(values[-1]) == ["hi", "Hello there.", "again", "Again."]

        # An approval: an interrupt, answered through the session with the decisions.
        model.script(ToolCalls([("tools__add", {"a": 2, "b": 3})]), Text("The sum is 5."))
        await within(thread.run.start(input=said("add 2 and 3")))
        await wait_for_async(lambda: thread.interrupted, timeout=30, message="the interrupt")
        [asked] = thread.interrupts
        assert asked["value"]["action_requests"][0]["args"] == {"a": 2, "b": 3}
        resumed = await subscribed(thread.messages)
        await within(thread.run.respond({"decisions": [{"type": "approve"}]}))
        assert (await within(resumed))[-1] == "The sum is 5."
    assert texts((await client.threads.get_state(thread_id))["values"])[-1] == "The sum is 5."

    # No thread id: the SDK mints one, and the first run.start creates the thread, the caller's.
    model.script(Text("A new thread."))
    # (Its projections, `output` among them, cannot subscribe before that run: the thread is not
    # there yet, and a fast run ends before they do. The run is joined and the state read instead.)
    # The session's close is bounded too: once in a dozen runs under load it held for good.
    async def a_fresh_thread() -> str:
        async with client.threads.stream(assistant_id="agent") as fresh:
            first = await fresh.run.start(input=said("new"))
            await client.runs.join(fresh.thread_id, first["run_id"])
        return fresh.thread_id

    fresh_id = await within(a_fresh_thread())
    state = await client.threads.get_state(fresh_id)
    assert texts(state["values"]) == ["new", "A new thread."]
    assert (await client.threads.get(fresh_id))["metadata"]["owner"] == "local"


@shared_stack
async def test_the_thread_streaming_sessions_unserved_parts_are_refused_by_name(
    client: LangGraphClient, stack: SophosEnv, model: FakeOllama
) -> None:
    thread_id = (await client.threads.create())["thread_id"]
    model.script(Text("Started over HTTP all the same."))
    async with client.threads.stream(thread_id, assistant_id="agent", transport="websocket") as thread:
        await thread.run.start(input=said("hi"))  # commands are HTTP on either transport
        with pytest.raises(ConnectionClosed) as refused:
            await thread.output.with_timeout(30)
    assert refused.value.rcvd is not None and refused.value.rcvd.code == 4404
    assert "websocket is not served" in refused.value.rcvd.reason
    async with async_http_client(base_url=stack.api_url) as http:
        answer = await http.post(f"/threads/{thread_id}/commands", json={
            "id": 7, "method": "state.fork", "params": {"checkpoint_id": "x"}})
        assert answer.json() == {"type": "error", "id": 7, "error": "not_supported", "message": (
            "state.fork is not served by Sophos: fork with runs.create and a checkpoint_id "
            "(docs/agent-protocol.md)")}
        answer = await http.post(f"/threads/{thread_id}/stream/events", json={"channels": ["tools"]})
        assert answer.status_code == 422 and "channel 'tools'" in answer.json()["error"]["message"]
