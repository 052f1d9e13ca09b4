"""A run's recorded ending, read one way everywhere (shared/redis/ended.py), and what waits on it.

A run that ended without a row (dropped by the sweep, refused, cancelled while queued) has its
ending only in Redis. Once its events expired (``EVENT_RETENTION``), every reader that waits for
a run's end (the native stream, the Agent Protocol's join, wait and stream) still ends, with the
ending Redis recorded; a run of which nothing is known at all gets a clear 404 after a bounded
wait. Real worker, API processes and Redis; the model is the fake Ollama.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

import httpx
from redis.asyncio import Redis

from shared.contracts.events import ENDING_PUBLISHED_WITHIN
from shared.redis.keys import ACTIVE_RUNS, arq_job_key, events_key, run_key
from tests.fakes.ollama import FakeOllama, Hang, Text
from tests.support.client import chat_async, read_sse_async, wait_for_async
from tests.support.env import SophosEnv
from tests.support.http import async_http_client
from worker.upkeep.sweep import SWEEP_SECONDS

#: a small retention, so a test sees a stream expire; pings often, so a relay looks often
FAST = {"EVENT_RETENTION": 1, "SSE_PING_INTERVAL": 0.2, "RATE_LIMIT_PER_MINUTE": 0}
#: what a reader of a run that ended may take at most: the worker's window for publishing an
#: ending after recording it (the relay waits that long for the stream), and a margin
BOUND_SECONDS = ENDING_PUBLISHED_WITHIN + 8


async def run_info(http: httpx.AsyncClient, run: str) -> dict[str, Any]:
    answer = await http.get(f"/api/runs/{run}")
    assert answer.status_code == 200, answer.text
    info: dict[str, Any] = answer.json()
    return info


async def dropped_run(api_url: str, model: FakeOllama, redis: Redis) -> tuple[str, str]:
    """A conversation with a completed run, then a run of it the sweep dropped before it started
    (its job expired in the queue): ``(conversation, run)``, the run ended without a row and its
    events expired."""
    model.script(Text("first answer"))
    conversation, first = await chat_async(api_url, "first")
    assert (await read_sse_async(api_url, conversation, run=first)).ended
    busy = Hang(text="busy ")
    model.script(busy)
    await chat_async(api_url, "hold the worker")
    await busy.wait_started_async(20)
    _, run = await chat_async(api_url, "dropped", conversation)
    await redis.delete(arq_job_key(run))  # as arq's record would expire
    async with async_http_client(base_url=api_url, timeout=10) as http:

        async def failed() -> bool:
            return (await run_info(http, run))["status"] == "failed"

        await wait_for_async(failed, SWEEP_SECONDS * 4, message="the sweep to drop the run")
    busy.release()
    await wait_for_async(lambda: _gone(redis, events_key(run)), 10, message="the run's events to expire")
    return conversation, run


async def _gone(redis: Redis, key: str) -> bool:
    return not await redis.exists(key)


async def test_a_rowless_run_whose_events_expired_still_ends_its_stream_and_its_join(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama, redis: Redis
) -> None:
    env = sophos_env.with_(**FAST)
    start_worker(env)
    api = start_api(env)
    conversation, run = await dropped_run(api.url, model, redis)

    # The native stream: missed, then the ending Redis recorded (the sweep's chat-error).
    began = time.monotonic()
    events = await read_sse_async(api.url, conversation, run=run, timeout=BOUND_SECONDS)
    assert events.types == ["missed", "chat-error"], events.types
    assert events[-1].data["run"] == run and events[-1].data["status"] == "failed"
    assert events[-1].data["code"] == "INTERRUPTED"  # the sweep's: it never started
    assert time.monotonic() - began < BOUND_SECONDS

    # The Agent Protocol's join and stream of the same run end too, within the bound.
    async with async_http_client(base_url=api.url, timeout=BOUND_SECONDS) as http:
        joined = await http.get(f"/threads/{conversation}/runs/{run}/join")
        assert joined.status_code == 200, joined.text
        assert [m["content"] for m in joined.json()["messages"]][-1] == "first answer"
        async with http.stream(
            "GET", f"/threads/{conversation}/runs/{run}/stream", headers={"Last-Event-ID": "-1"}
        ) as streamed:
            assert streamed.status_code == 200
            body = (await streamed.aread()).decode()
        assert "event: error" in body and "event: end" in body, body
    # What the runs view says of it is what the stream said.
    async with async_http_client(base_url=api.url, timeout=10) as http:
        info = await run_info(http, run)
    assert info["status"] == "failed" and info["error"]["code"] == events[-1].data["code"]


async def test_a_run_of_which_nothing_is_known_gets_a_clear_answer_after_a_bounded_wait(
    sophos_env: SophosEnv, start_api, redis: Redis
) -> None:
    """No row, no record, no events (Redis lost them): a stream that follows the run closes, a
    join answers 404, each within the bound; a stream opened then is 404 at once."""
    env = sophos_env.with_(**FAST)
    api = start_api(env)  # no worker: the run stays queued
    conversation, run = await chat_async(api.url, "lost")
    async with async_http_client(base_url=api.url, timeout=BOUND_SECONDS + 5) as http:
        opened = api.log_text().count('"relay.opened"')
        following = asyncio.create_task(
            read_sse_async(api.url, conversation, run=run, timeout=BOUND_SECONDS, allow_drop=True)
        )
        joining = asyncio.create_task(http.get(f"/threads/{conversation}/runs/{run}/join"))
        await wait_for_async(lambda: _opened(api, opened + 2), 10, message="both to follow the run")
        began = time.monotonic()
        await redis.delete(run_key(run), arq_job_key(run), events_key(run))
        await redis.hdel(ACTIVE_RUNS, conversation)

        followed = await following
        assert followed.types == [] and not followed.ended
        joined = await joining
        assert joined.status_code == 404, joined.text
        assert joined.json()["error"]["code"] == "NOT_FOUND"
        assert time.monotonic() - began < BOUND_SECONDS
        # Asked again, the answer is at once.
        again = await read_sse_async(api.url, conversation, run=run, timeout=5, raise_on_status=False)
        assert again.status_code == 404


async def _opened(api: Any, count: int) -> bool:
    return api.log_text().count('"relay.opened"') >= count


async def test_protocol_joins_waits_and_streams_count_against_the_per_client_stream_limit(
    sophos_env: SophosEnv, start_api
) -> None:
    """Each holds what a native stream holds (a relay of the run) for as long: each takes a slot."""
    env = sophos_env.with_(MAX_STREAMS_PER_CLIENT=1, RATE_LIMIT_PER_MINUTE=0)
    api = start_api(env)  # no worker: the run stays queued, whatever follows it stays open
    conversation, run = await chat_async(api.url, "wait in the queue")
    # The probe: a stream of a run past its end, answered 204 at once, so it holds no slot itself.
    other, cancelled = await chat_async(api.url, "cancelled in the queue")
    async with async_http_client(base_url=api.url, timeout=10) as http:
        assert (await http.post(f"/api/runs/{cancelled}/cancel")).status_code == 200
    probe = {"conversation": other, "run": cancelled, "lastEventId": "1"}
    thread = f"/threads/{conversation}/runs"
    message = {"messages": [{"role": "user", "content": "behind it"}]}
    held_requests: dict[str, tuple[str, str, dict[str, Any]]] = {
        "join": ("GET", f"{thread}/{run}/join", {}),
        "stream": ("GET", f"{thread}/{run}/stream", {}),
        "wait": ("POST", f"{thread}/wait",
                 {"json": {"assistant_id": "agent", "multitask_strategy": "enqueue", "input": message}}),
    }
    async with async_http_client(base_url=api.url, timeout=10) as http:
        for name, (method, path, options) in held_requests.items():
            held = asyncio.create_task(_hold(http, method, path, options))
            try:
                # Once the held request is in, the client's one slot is taken: a stream is refused.
                deadline = time.monotonic() + 10
                while (refused := await _stream_status(http, probe))[0] != 429:
                    assert not held.done(), (name, held)
                    assert time.monotonic() < deadline, f"a {name} held took no slot"
                    await asyncio.sleep(0.1)
                assert json.loads(refused[1])["error"]["code"] == "RATE_LIMITED"
            finally:
                held.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await held
            await _slot_free(http, probe)
        # The wait's client left: the wait stopped, the run it created goes on (queued, no worker).
        queued = (await http.get("/api/runs", params={"conversation": conversation})).json()["runs"]
        assert [r["status"] for r in queued] == ["queued", "queued"], queued


async def _stream_status(http: httpx.AsyncClient, params: dict[str, str]) -> tuple[int, str]:
    async with http.stream("GET", "/api/chat", params=params) as response:
        return response.status_code, (await response.aread()).decode()


async def _hold(http: httpx.AsyncClient, method: str, path: str, options: dict[str, Any]) -> None:
    """The request, held open; retried while the slot of the one before is still being given back."""
    deadline = time.monotonic() + 10
    while True:
        async with http.stream(method, path, timeout=None, **options) as response:
            if response.status_code == 429 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
                continue
            assert response.status_code == 200, (path, (await response.aread()).decode())
            await response.aread()
            return


async def _slot_free(http: httpx.AsyncClient, probe: dict[str, str]) -> None:
    """The held request's slot is given back once its client left."""
    deadline = time.monotonic() + 10
    while (await _stream_status(http, probe))[0] != 204:
        assert time.monotonic() < deadline, "the slot of a closed request was not given back"
        await asyncio.sleep(0.1)
