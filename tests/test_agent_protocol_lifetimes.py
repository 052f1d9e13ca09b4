"""How long threads live, and the thread streams (docs/agent-protocol.md), driven by the real
``langgraph-sdk`` client against a real API and worker with the fake model, on one stack for the
module: a thread's ``ttl`` (on a create and an update) and the retention of threads left empty,
both deleted by the worker; the per-user cap on empty threads; ``threads.join_stream``; a cron's
``end_time``, and ``crons.count``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.errors import APIStatusError, NotFoundError

from shared.contracts.crons import tick_thread_id
from tests.fakes.ollama import FakeOllama, Text
from tests.support.agent_protocol import said
from tests.support.client import wait_for_async
from tests.support.env import SophosEnv
from tests.support.http import async_http_client
from tests.support.stacks import Stack, own_redis_stack

shared_stack = pytest.mark.xdist_group("test_agent_protocol_lifetimes")

#: minutes a thread may stay empty on this stack (EMPTY_THREAD_RETENTION_MINUTES): 6 s
EMPTY_MINUTES = 0.1
#: empty threads a user may hold on this stack (USER_MAX_EMPTY_THREADS)
MAX_EMPTY = 4
#: SSE_PING_INTERVAL: a thread's idle stream also looks at the thread at each ping; a run it
#: streams well before one is woken, not found by that look
PING_SECONDS = 10.0


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory, fake_ollama: FakeOllama) -> Iterator[Stack]:
    with own_redis_stack(
        tmp_path_factory.mktemp("lifetimes"), fake_ollama,
        EMPTY_THREAD_RETENTION_MINUTES=str(EMPTY_MINUTES), USER_MAX_EMPTY_THREADS=str(MAX_EMPTY),
        SSE_PING_INTERVAL=str(PING_SECONDS),
    ) as started:
        yield started


@pytest.fixture(scope="module")
def stack(whole: Stack) -> SophosEnv:
    return whole.env


async def _gone(client: LangGraphClient, thread_id: str) -> bool:
    try:
        await client.threads.get(thread_id)
    except NotFoundError:
        return True
    return False


def refusal(exc: BaseException) -> tuple[int, str]:
    assert isinstance(exc, httpx.HTTPStatusError | APIStatusError)
    return exc.response.status_code, exc.response.json()["error"]["message"]


@shared_stack
async def test_threads_past_their_ttl_or_left_empty_are_deleted_by_the_worker(
    client: LangGraphClient, model: FakeOllama, stack: SophosEnv
) -> None:
    model.script(Text("One."), Text("Two."), Text("Three."))
    kept = (await client.threads.create())["thread_id"]  # no ttl, and a run: kept
    await client.runs.wait(kept, "agent", input=said("keep me"))
    with_ttl = (await client.threads.create(ttl={"strategy": "delete", "ttl": 0.05}))["thread_id"]
    await client.runs.wait(with_ttl, "agent", input=said("a short life"))
    updated = (await client.threads.create())["thread_id"]
    await client.runs.wait(updated, "agent", input=said("a life made short"))
    # The SDK sends {"ttl": 0.05, "strategy": "delete"}.
    await client.threads.update(updated, metadata={"short": True}, ttl=0.05)
    with_cron = (await client.threads.create())["thread_id"]  # empty, but a cron's: kept
    await client.crons.create_for_thread(with_cron, "agent", schedule="0 0 1 1 *", input=said("new year"))
    empty = (await client.threads.create())["thread_id"]  # no ttl, no run: EMPTY_MINUTES

    async with async_http_client(base_url=stack.api_url) as http:
        for thread_id in (with_ttl, updated, empty):
            await wait_for_async(lambda t=thread_id: _gone(client, t), 60, interval=0.2,
                                 message=f"thread {thread_id} expired")
            # Its conversation and history went with it: the worker's delete job.
            assert (await http.get(f"/api/conversations/{thread_id}")).status_code == 404
        # The empty one was due last (6 s after its creation): the one without a ttl that ran,
        # due before it, was looked at and kept (its conversation's own retention governs it),
        # and so was the empty one with a cron.
        thread = await client.threads.get(kept)
        assert [m["content"] for m in thread["values"]["messages"]] == ["keep me", "One."]
        assert (await http.get(f"/api/conversations/{kept}")).status_code == 200
        assert (await client.threads.get(with_cron))["status"] == "idle"
    await client.threads.delete(with_cron)


@shared_stack
async def test_a_ttl_is_refused_by_name_unless_it_is_deletes_minutes(client: LangGraphClient) -> None:
    before = await client.threads.count()
    for ttl, named in (
        ({"strategy": "keep_latest", "ttl": 5}, "keep_latest"),
        ({"ttl": 0}, "minutes"),
        ({"ttl": "soon"}, "minutes"),
        ({"ttl": 5, "after": "x"}, "after"),
    ):
        with pytest.raises(APIStatusError) as refused:
            await client.threads.create(ttl=ttl)
        status, message = refusal(refused.value)
        assert status == 422 and named in message, message
    assert await client.threads.count() == before
    thread_id = (await client.threads.create())["thread_id"]
    with pytest.raises(APIStatusError) as refused:
        await client.threads.update(thread_id, metadata={}, ttl={"strategy": "keep_latest", "ttl": 5})
    assert refusal(refused.value)[0] == 422
    await client.threads.delete(thread_id)


@shared_stack
async def test_empty_threads_are_capped_per_user_and_a_run_frees_a_place(
    client: LangGraphClient, model: FakeOllama
) -> None:
    model.script(Text("Ran."))
    for thread in await client.threads.search(status="idle", limit=100):
        if not thread["values"]:  # left empty by another test of the module
            await client.threads.delete(thread["thread_id"])
    mine = [(await client.threads.create())["thread_id"] for _ in range(MAX_EMPTY)]
    with pytest.raises(APIStatusError) as refused:
        await client.threads.create()
    status, message = refusal(refused.value)
    assert status == 409 and refused.value.response.json()["error"]["code"] == "TOO_MANY_EMPTY_THREADS"
    assert f"at most {MAX_EMPTY}" in message and "USER_MAX_EMPTY_THREADS" in message, message

    # A run on one makes it a thread with history: a place for one more, and no more.
    ran = await client.runs.create(mine[0], "agent", input=said("no longer empty"))
    mine.append((await client.threads.create())["thread_id"])
    with pytest.raises(APIStatusError):
        await client.threads.create()
    # So does deleting one.
    await client.threads.delete(mine[1])
    mine.append((await client.threads.create())["thread_id"])
    for thread_id in mine[2:]:
        await client.threads.delete(thread_id)
    # Its answer taken before the next test scripts its own (it once took the next test's first).
    await client.runs.join(mine[0], ran["run_id"])


async def _ends(parts: list[Any], count: int) -> bool:
    return sum(p.event == "end" for p in parts) >= count


@shared_stack
async def test_join_stream_follows_every_run_of_the_thread_as_it_comes(
    client: LangGraphClient, model: FakeOllama, stack: SophosEnv
) -> None:
    model.script(Text("First."), Text("Second."), Text("Third."))
    thread_id = (await client.threads.create())["thread_id"]
    parts: list[Any] = []

    async def follow() -> None:
        async for part in await client.threads.join_stream(thread_id):
            parts.append(part)

    joined = asyncio.create_task(follow())
    try:
        first = await client.runs.create(thread_id, "agent", input=said("one"))
        second = await client.runs.create(thread_id, "agent", input=said("two"))  # enqueued behind
        await wait_for_async(lambda: _ends(parts, 2), message=lambda: f"both runs streamed: {parts}")
        await client.runs.join(thread_id, second["run_id"])
        # The thread is idle now; a run accepted later wakes the stream (no poll).
        third = await client.runs.create(thread_id, "agent", input=said("three"))
        await wait_for_async(
            lambda: any(p.event == "metadata" and p.data["run_id"] == third["run_id"] for p in parts),
            PING_SECONDS / 2, message="the later run's stream begun, woken",
        )
        await wait_for_async(lambda: _ends(parts, 3), message="the later run streamed")
    finally:
        joined.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await joined

    runs = [p.data["run_id"] for p in parts if p.event == "metadata"]
    assert runs == [first["run_id"], second["run_id"], third["run_id"]]
    # Each run in its own modes (values by default), from its start (its input taken) to its end.
    segments: list[list[Any]] = []
    for part in parts:
        if part.event == "metadata":
            segments.append([])
        segments[-1].append(part)
    for segment, asked in zip(segments, ("one", "two", "three"), strict=True):
        taken = next(p for p in segment if p.event == "values")
        assert taken.data["messages"][-1]["content"] == asked
        assert segment[-1].event == "end"
    # Each run's last values are the state it left (its own last checkpoint), even the first's,
    # whose end the second run, waiting behind it, follows at once.
    left = (["one", "First."], ["one", "First.", "two", "Second."])
    for segment, ended in zip(segments, left, strict=False):
        assert [m["content"] for m in segment[-2].data["messages"]] == ended
    assert segments[-1][-2].data["messages"][-1]["content"] == "Third."
    assert [p.data["status"] for p in parts if p.event == "end"] == ["success"] * 3
    third_parts = [p for p in parts if p.id and p.id.startswith(f"{third['run_id']}:")]
    assert third_parts and all(p.event != "metadata" for p in third_parts)

    # Back with the id of a part of the third run: the rest of it, then the thread's next runs.
    resumed: list[Any] = []

    async def follow_from() -> None:
        async for part in await client.threads.join_stream(thread_id, last_event_id=third_parts[0].id):
            resumed.append(part)

    rejoined = asyncio.create_task(follow_from())
    try:
        await wait_for_async(lambda: _ends(resumed, 1), message="the rest of the third run")
    finally:
        rejoined.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await rejoined
    assert [p.id for p in resumed] == [p.id for p in third_parts[1:]]

    async with async_http_client(base_url=stack.api_url) as http:
        lifecycle = await http.get(f"/threads/{thread_id}/stream", params={"stream_mode": "lifecycle"})
        assert lifecycle.status_code == 422 and "lifecycle" in lifecycle.json()["error"]["message"]
        bad_id = await http.get(f"/threads/{thread_id}/stream", headers={"Last-Event-ID": "7-1"})
        assert bad_id.status_code == 422 and "run id" in bad_id.json()["error"]["message"]
    with pytest.raises(NotFoundError):
        async for _ in await client.threads.join_stream(str(uuid.uuid4())):
            pass


@shared_stack
async def test_a_cron_fires_no_tick_past_its_end_time_and_crons_are_counted(
    client: LangGraphClient, stack: SophosEnv
) -> None:
    thread_id = (await client.threads.create())["thread_id"]
    tag = str(uuid.uuid4())
    ends = datetime.now(UTC) + timedelta(seconds=3)
    cron = await client.crons.create_for_thread(
        thread_id, "agent", schedule="* * * * * *", input=said("tick"), end_time=ends, metadata={"tag": tag},
    )
    cron_id = cron["cron_id"]
    assert datetime.fromisoformat(cron["end_time"]) == ends.replace(microsecond=0)

    async def ended() -> dict[str, Any] | None:
        [found] = await client.crons.search(thread_id=thread_id)
        return found if found["next_run_date"] is None and found["fired"] >= 1 else None

    stopped = await wait_for_async(ended, message="the cron's ticks run out at its end_time")
    assert datetime.fromisoformat(stopped["last_tick"]["tick"]) <= ends and stopped["enabled"]
    assert await client.crons.count(thread_id=thread_id) == 1
    assert await client.crons.count(metadata={"tag": tag}) == 1
    assert await client.crons.count(metadata={"tag": "none such"}) == 0

    # end_time=None removes it: the cron fires again, past the old end.
    cleared = await client.crons.update(cron_id, end_time=None)
    assert cleared["end_time"] is None and cleared["next_run_date"] is not None

    async def fired_past_the_end() -> bool:
        [found] = await client.crons.search(thread_id=thread_id)
        return datetime.fromisoformat(found["last_tick"]["tick"]) > ends

    await wait_for_async(fired_past_the_end, message="a tick past the old end_time")
    again = await client.crons.update(cron_id, end_time=datetime.now(UTC) - timedelta(hours=1))
    assert again["next_run_date"] is None
    async with async_http_client(base_url=stack.api_url) as http:
        bad = await http.patch(f"/runs/crons/{cron_id}", json={"end_time": "soon"})
        assert bad.status_code == 422 and "end_time" in bad.json()["error"]["message"]
    await client.crons.delete(cron_id)
    assert await client.crons.count(thread_id=thread_id) == 0


@shared_stack
async def test_a_cron_without_a_thread_deletes_each_ticks_thread_once_its_run_ended(
    client: LangGraphClient, whole: Stack
) -> None:
    cron = await client.crons.create("agent", schedule="* * * * * *", input=said("a tick alone"))
    assert cron["on_run_completed"] == "delete"  # the Agent Server's default
    cron_id = cron["cron_id"]

    async def first_fired() -> int | None:
        [found] = [c for c in await client.crons.search(limit=100) if c["cron_id"] == cron_id]
        last = found["last_tick"]
        if not found["fired"] or not last["run_id"]:
            return None
        return int(datetime.fromisoformat(last["tick"]).timestamp())

    tick = await wait_for_async(first_fired, message="a tick fired")
    thread_id = tick_thread_id(cron_id, tick)

    def deleted_after_its_run() -> bool:
        lines = [json.loads(line) for line in whole.worker.log_text().splitlines() if thread_id in line]
        wanted = {"event": "conversation.deleted", "reason": "expired", "runs": 1}
        return any(all(line.get(k) == v for k, v in wanted.items()) for line in lines)

    await wait_for_async(deleted_after_its_run, message=f"tick thread {thread_id} deleted by the worker")
    assert await _gone(client, thread_id)
    await client.crons.delete(cron_id)
