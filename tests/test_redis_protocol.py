"""One home for the Redis protocol (issue 11, part 7): scripts by SHA, one terminal event shape.

Real worker, API and Redis. Every script the service runs is registered once per
Redis client (shared/redis/scripts/) and sent as ``EVALSHA``; a Redis whose
script cache was emptied (``SCRIPT FLUSH``, as a restart does) is served by
redis-py loading the script again, alone or inside a pipeline. The terminal
event, whichever of its producers wrote it (the worker, the cancel script, the
sweep's script, the relay from a row), has the fields of ``terminal_event``.
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from typing import Any

from redis.asyncio import Redis

from shared.contracts.events import body, event_type, terminal_event
from shared.contracts.jobs import JobKind, RunJob
from shared.redis.keys import arq_job_key, events_key, run_key
from shared.redis.queue import submit_run
from tests.fakes.ollama import FakeOllama, Hang, Status, Text
from tests.support.client import chat, read_sse, read_sse_async, wait_for_async
from tests.support.env import SophosEnv
from tests.support.http import async_http_client, http_client
from worker.upkeep.sweep import SWEEP_SECONDS

STREAM_TIMEOUT = 30.0


def command_calls(stats: dict[str, Any], command: str) -> int:
    """Calls of ``command`` in ``INFO commandstats`` (0 if it never ran since the last reset)."""
    entry = stats.get(f"cmdstat_{command}")
    return int(entry["calls"]) if entry else 0


async def scripting_calls(redis: Redis) -> dict[str, int]:
    stats = await redis.info("commandstats")
    # Redis 6 counts SCRIPT LOAD and SCRIPT EXISTS (a pipeline's check) together, as ``script``.
    return {name: command_calls(stats, name) for name in ("eval", "evalsha", "script")}


def delete_conversation(api_url: str, conversation: str) -> int:
    with http_client(base_url=api_url, timeout=10) as http:
        return http.delete(f"/api/conversations/{conversation}").status_code


async def test_scripts_run_by_sha_and_are_loaded_again_after_a_script_flush(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama, redis: Redis
) -> None:
    model.script(*(Text(f"answer {i}") for i in range(6)))
    start_worker(sophos_env)
    api = start_api(sophos_env).url
    await redis.config_resetstat()

    # Submit (API), take (worker), release (worker, in a pipeline): three scripts a run.
    for i in range(2):
        conversation, run = chat(api, f"hello {i}")
        assert read_sse(api, conversation, timeout=STREAM_TIMEOUT)[-1].data["status"] == "completed"
    before = await scripting_calls(redis)
    print(f"\nafter 2 runs: {before}")
    assert before["eval"] == 0, before
    assert before["evalsha"] >= 6, before

    # The script cache emptied, as by a restart: every script is loaded again and still runs.
    await redis.script_flush()
    conversation, run = chat(api, "after the flush")
    assert read_sse(api, conversation, timeout=STREAM_TIMEOUT)[-1].data == {
        "conversation": conversation,
        "run": run,
        "status": "completed",
    }
    # Released by the worker's pipeline: the next message of the conversation is accepted.
    _, following = chat(api, "and again", conversation)
    assert read_sse(api, conversation, timeout=STREAM_TIMEOUT)[-1].data["run"] == following
    assert delete_conversation(api, conversation) == 204  # the delete script, after the flush too
    after = await scripting_calls(redis)
    print(f"after a SCRIPT FLUSH and 2 more runs and a delete: {after}")
    assert after["eval"] == 0, after
    # Submit, take and release at least, each loaded again (on NOSCRIPT, or by the pipeline's check).
    assert after["script"] - before["script"] >= 3, after
    assert after["evalsha"] - before["evalsha"] >= 7, after


async def test_a_restart_empties_the_script_cache_and_runs_go_on(
    sophos_env: SophosEnv, start_redis, start_worker, start_api, model: FakeOllama
) -> None:
    # Without AOF: Redis 6 writes SCRIPT LOAD to its AOF and replays it, so a restart of
    # a Redis with AOF on keeps the scripts; without it, the restart empties the cache.
    server = start_redis(appendonly=False)
    own = sophos_env.with_(REDIS_URL=server.url)
    model.script(Text("before"), Text("after"))
    worker = start_worker(own)
    api = start_api(own).url
    conversation, _ = chat(api, "before the restart")
    assert read_sse(api, conversation, timeout=STREAM_TIMEOUT)[-1].data["status"] == "completed"

    server.restart(signal.SIGTERM, down_for=0.5)
    client = Redis.from_url(server.url, decode_responses=True)
    try:
        _, run = chat(api, "after the restart", conversation)
        assert read_sse(api, conversation, timeout=STREAM_TIMEOUT)[-1].data["run"] == run
        calls = await scripting_calls(client)  # the restart reset the stats too
        assert calls["eval"] == 0 and calls["script"] >= 3, calls
    finally:
        await client.aclose()
    assert worker.alive


def _job() -> RunJob:
    return RunJob(
        run_id=str(uuid.uuid4()),
        conversation_id=str(uuid.uuid4()),
        kind=JobKind.RUN,
        message="hello",
        enqueued_at=time.time(),
    )


async def _terminal_entry(redis: Redis, run_id: str) -> tuple[str, dict[str, Any]]:
    """The run's last stream entry, which must be its terminal event: (type, data)."""

    async def last() -> list[Any] | None:
        entries = await redis.xrevrange(events_key(run_id), count=1)
        if entries and entries[0][1]["type"] in ("end", "chat-error"):
            return entries  # type: ignore[no-any-return]
        return None

    entries = await wait_for_async(last, timeout=SWEEP_SECONDS * 4, message=f"the terminal event of {run_id}")
    fields = entries[0][1]
    return fields["type"], json.loads(fields["data"])


def _expected(event: Any) -> tuple[str, set[str]]:
    return str(event_type(event).value), set(body(event))


async def test_every_producer_writes_the_terminal_event_of_one_shape(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama, redis: Redis
) -> None:
    hang = Hang(text="busy ")
    model.script(hang, Status(500), Text("done"))
    start_worker(sophos_env)
    api = start_api(sophos_env).url
    busy_conversation, busy = chat(api, "keep the worker busy")
    await hang.wait_started_async()

    # Queued behind the busy run (the worker takes one job at a time): cancelled by the script.
    queued = _job()
    assert await submit_run(redis, queued, title="hello") is None
    async with async_http_client(base_url=api, timeout=10) as http:
        assert (await http.post(f"/api/runs/{queued.run_id}/cancel")).status_code == 200
    # Its job record lost, as arq's expiry would: the live worker's sweep drops it.
    expired = _job()
    assert await submit_run(redis, expired, title="hello") is None
    await redis.delete(arq_job_key(expired.run_id), run_key(expired.run_id))

    cancel_script = await _terminal_entry(redis, queued.run_id)
    sweep_script = await _terminal_entry(redis, expired.run_id)

    # The worker's: a running run cancelled, a failed one, a completed one.
    async with async_http_client(base_url=api, timeout=10) as http:
        assert (await http.post(f"/api/runs/{busy}/cancel")).status_code == 202
    worker_cancelled = await _terminal_entry(redis, busy)
    failed_conversation, failed = chat(api, "fail", busy_conversation)
    worker_failed = await _terminal_entry(redis, failed)
    _, completed = chat(api, "complete", failed_conversation)
    worker_completed = await _terminal_entry(redis, completed)
    # The relay's, rebuilt from the row for a client joining the finished run (its stream gone).
    await redis.delete(events_key(failed))
    relayed = (await read_sse_async(api, failed_conversation, run=failed, timeout=STREAM_TIMEOUT))[-1]

    end = _expected(terminal_event("c", "r", "completed"))
    error = _expected(terminal_event("c", "r", "failed", "CODE", "message"))
    assert end == ("end", {"conversation", "run", "status"})
    assert error == ("chat-error", {"conversation", "run", "status", "code", "message"})
    for produced in (cancel_script, worker_cancelled, worker_completed):
        assert (produced[0], set(produced[1])) == end, produced
    for produced in (sweep_script, worker_failed, (relayed.event, relayed.data)):
        assert (produced[0], set(produced[1])) == error, produced
    assert cancel_script[1] == {
        "conversation": queued.conversation_id,
        "run": queued.run_id,
        "status": "cancelled",
    }
    assert sweep_script[1]["status"] == "failed" and sweep_script[1]["code"] == "INTERRUPTED"
    assert worker_failed[1]["status"] == "failed" and relayed.data == worker_failed[1]


def test_the_scripts_end_a_run_only_through_the_one_lua_ending() -> None:
    """A script that appends to a run's stream does it through ``end_run`` (the fields of
    :func:`terminal_event`), never with an XADD of its own."""
    from shared.redis import scripts as redis_protocol

    texts = {name: text for name, text in vars(redis_protocol).items() if name.endswith("_LUA")}
    ending = {name for name, text in texts.items() if "end_run(" in text.replace(redis_protocol.END_LUA, "")}
    assert ending == {"CANCEL_QUEUED_LUA", "DROP_UNSTARTED_LUA", "END_RUN_LUA"}
    for name, text in texts.items():
        own = text.replace(redis_protocol.END_LUA, "")
        assert "XADD" not in own, name
