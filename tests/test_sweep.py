"""No claim outlives its run (issue 11, part 1): the live worker's sweep.

arq drops a job whose record expired while it was still queued ("job expired")
without calling the job function, so nothing the run would have done at its end
(free the conversation, record an outcome, end the stream) happens. The sweep
does it, in the live worker, within a few seconds; and it must never touch a run
that is still queued, being taken, or running.

The first test is end to end (real worker and API, the job's expiry simulated by
deleting its record and description as Redis's TTL would); the others drive one
sweep pass against the real Redis and a real SQLite file, one case per claim.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from shared.contracts.jobs import JobKind, RunJob, delete_claim
from shared.contracts.runs import RunStatus
from shared.redis.keys import (
    ACTIVE_RUNS,
    CANCELLED_RETENTION_SECONDS,
    CANCELLED_RUNS,
    QUEUE_NAME,
    arq_in_progress_key,
    arq_job_key,
    events_key,
    run_key,
    taken_key,
    worker_heartbeat_key,
)
from shared.redis.metrics import METRICS_KEY, RUNS_FINISHED, counter_field
from shared.redis.queue import drop_unstarted, submit_run
from shared.settings import Settings
from tests.fakes.ollama import FakeOllama, Hang, Text
from tests.support.client import get_json, read_sse_async, wait_for_async
from tests.support.env import SophosEnv
from tests.support.faults import accepted
from tests.support.http import http_client
from worker.store import RunStore
from worker.upkeep.sweep import SWEEP_SECONDS, ClaimSweep

#: A few sweep intervals, generous for a loaded machine.
SWEPT_WITHIN = SWEEP_SECONDS * 4


def run_info(api_url: str, run_id: str) -> dict[str, Any] | None:
    """``GET /api/runs/{id}``; None while it answers 404."""
    with http_client(base_url=api_url, timeout=10) as http:
        response = http.get(f"/api/runs/{run_id}")
    if response.status_code == 404:
        return None
    assert response.status_code == 200, response.text
    info: dict[str, Any] = response.json()
    return info


def run_status(api_url: str, run_id: str) -> str | None:
    info = run_info(api_url, run_id)
    return None if info is None else str(info["status"])


async def test_a_run_whose_job_expired_in_the_queue_frees_its_conversation(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama, redis: Redis
) -> None:
    busy = Hang(text="busy ")
    model.script(Text("First answer."), busy, Text("Third answer."), Text("Again."))
    worker = start_worker(sophos_env)
    api = start_api(sophos_env).url
    conversation, first = accepted(api, "first")
    await wait_for_async(lambda: run_status(api, first) == "completed", message="the first run completed")

    # The worker is held by another conversation: the next runs wait in the queue.
    accepted(api, "hold the worker")
    await busy.wait_started_async()
    _, expired = accepted(api, "second", conversation)
    third_conversation, third = accepted(api, "third")
    watcher = asyncio.create_task(read_sse_async(api, conversation, timeout=SWEPT_WITHIN * 2))
    await wait_for_async(
        lambda: get_json(api, "/metrics", raw=True).count("sophos_sse_subscribers 1.0"),
        message="the watcher connected",
    )
    # What a day in the queue does: the job's record and the run's description expire.
    await redis.delete(arq_job_key(expired), run_key(expired))

    info = await wait_for_async(
        lambda: (r := run_info(api, expired)) is not None and r["status"] == "failed" and r,
        timeout=SWEPT_WITHIN, message="the expired run recorded failed",
    )
    assert info["conversation"] == conversation and info["startedAt"] is None
    assert info["error"]["code"] == "INTERRUPTED" and "never started" in info["error"]["message"]
    events = await watcher
    assert events[-1].event == "chat-error"
    assert events[-1].data["run"] == expired and "never started" in events[-1].data["message"]
    # The run queued behind it, with its job intact, was left alone.
    assert run_status(api, third) == "queued"
    assert await redis.hget(ACTIVE_RUNS, third_conversation) == third  # type: ignore[misc]

    # The conversation takes a new message at once, from the same worker.
    _, again = accepted(api, "again", conversation)
    busy.release()
    for run in (third, again):
        await wait_for_async(lambda r=run: run_status(api, r) == "completed", timeout=20,
                             message=f"run {run} completed")
    assert worker.alive and model.calls == 4  # the expired run never reached the model
    assert worker.wait_for_log(lambda line: expired in line and "run.dropped_unstarted" in line)


# --- one pass, case by case ------------------------------------------------------------


def _job(conversation_id: str | None = None) -> RunJob:
    return RunJob(
        run_id=str(uuid.uuid4()), conversation_id=conversation_id or str(uuid.uuid4()),
        kind=JobKind.RUN, message="hello", enqueued_at=time.time(),
    )


@pytest.fixture
async def store(tmp_path: Path):
    store = await RunStore.open(Settings(database_path=tmp_path / "sophos.db"))
    yield store
    await store.close()


async def _submitted(redis: Redis) -> RunJob:
    job = _job()
    assert await submit_run(redis, job, title="hello") is None
    return job


async def _claim(redis: Redis, job: RunJob) -> str | None:
    return await redis.hget(ACTIVE_RUNS, job.conversation_id)  # type: ignore[misc]


async def test_one_pass_releases_only_the_claims_whose_run_will_never_run(
    redis: Redis, store: RunStore
) -> None:
    queued = await _submitted(redis)
    # arq is taking it this instant: the record is gone, the in-progress marker set.
    being_taken = await _submitted(redis)
    await redis.delete(arq_job_key(being_taken.run_id))
    await redis.set(arq_in_progress_key(being_taken.run_id), "1", px=60_000)
    # Executing here, with its job already out of Redis (Redis lost it, say).
    executing = await _submitted(redis)
    await redis.delete(arq_job_key(executing.run_id))
    await redis.zrem(QUEUE_NAME, executing.run_id)
    # Recorded running in the database.
    running = await _submitted(redis)
    assert await store.start_run(running) is None
    await redis.delete(arq_job_key(running.run_id))
    await redis.zrem(QUEUE_NAME, running.run_id)
    # Finished, but its release was lost.
    finished = await _submitted(redis)
    assert await store.start_run(finished) is None
    await store.finish_run(finished.run_id, finished.conversation_id, status=RunStatus.COMPLETED)
    await redis.delete(arq_job_key(finished.run_id))
    await redis.zrem(QUEUE_NAME, finished.run_id)
    # Never started: its job expired in the queue (still queued, no record) ...
    expired = await _submitted(redis)
    await redis.delete(arq_job_key(expired.run_id))
    # ... or arq already dropped it ("job expired": out of the queue), its description gone too.
    dropped = await _submitted(redis)
    await redis.delete(arq_job_key(dropped.run_id), run_key(dropped.run_id))
    await redis.zrem(QUEUE_NAME, dropped.run_id)

    # Refused by the database when the worker took it (recorded in its description), and the
    # release that followed was lost.
    refused = await _submitted(redis)
    await redis.delete(arq_job_key(refused.run_id))
    await redis.zrem(QUEUE_NAME, refused.run_id)
    said = {"status": "failed", "failed_at": "1", "error_code": "DATABASE_UNAVAILABLE", "error_message": "x"}
    await redis.hset(run_key(refused.run_id), mapping=said)  # type: ignore[misc]

    sweep = ClaimSweep(redis, store, executing=lambda: {executing.run_id}, event_retention=60)
    report = await sweep.once()
    assert (report.dropped, report.released) == (3, 1)
    assert await _claim(redis, refused) is None
    assert said.items() <= (await redis.hgetall(run_key(refused.run_id))).items()  # type: ignore[misc]
    assert await redis.exists(events_key(refused.run_id)) == 0

    for kept in (queued, being_taken, executing, running):
        assert await _claim(redis, kept) == kept.run_id, kept
    assert await redis.zscore(QUEUE_NAME, queued.run_id) is not None
    assert await _claim(redis, finished) is None
    # A finished run keeps its record as it was: no second outcome, no event.
    assert (await store.get_run(finished.run_id)).status == "completed"  # type: ignore[union-attr]
    assert await redis.exists(events_key(finished.run_id)) == 0

    for gone in (expired, dropped):
        assert await _claim(redis, gone) is None
        assert await redis.zscore(QUEUE_NAME, gone.run_id) is None
        assert await store.get_run(gone.run_id) is None
        record = await redis.hgetall(run_key(gone.run_id))  # type: ignore[misc]
        assert record["conversation"] == gone.conversation_id and record["status"] == "failed"
        assert record["error_code"] == "INTERRUPTED" and float(record["failed_at"]) > 0
        assert 0 < await redis.ttl(run_key(gone.run_id)) <= CANCELLED_RETENTION_SECONDS
        entries = await redis.xrange(events_key(gone.run_id))
        assert [(i, f["type"]) for i, f in entries] == [("1-0", "chat-error")]
        data = json.loads(entries[0][1]["data"])
        assert data["run"] == gone.run_id and data["conversation"] == gone.conversation_id
        assert data["status"] == "failed" and data["code"] == "INTERRUPTED"
        assert 0 < await redis.ttl(events_key(gone.run_id)) <= 60
    # The description that was still there keeps what it said of the run.
    assert (await redis.hgetall(run_key(expired.run_id)))["title"] == "hello"  # type: ignore[misc]
    field = counter_field(RUNS_FINISHED, status="failed")
    assert await redis.hget(METRICS_KEY, field) == "2"  # type: ignore[misc]

    # Once arq is done with the job it was taking (it found no record), the claim goes too.
    await redis.delete(arq_in_progress_key(being_taken.run_id))
    assert (await sweep.once()).dropped == 1
    assert await _claim(redis, being_taken) is None
    # A second pass finds nothing more to do.
    assert await sweep.once() == type(report)()


async def test_a_delete_claim_whose_job_expired_is_released_as_no_run(redis: Redis, store: RunStore) -> None:
    """A delete's claim is no run: released, with no run record, no event and no count.

    Before: the sweep took it for a run that never started (a ``failed`` run hash under
    the claim, a ``chat-error`` on a stream of that name, a failed run counted).
    """
    conversation, claim = str(uuid.uuid4()), delete_claim(str(uuid.uuid4()))
    await redis.hset(ACTIVE_RUNS, conversation, claim)  # type: ignore[misc]
    # Its job expired in the queue, as arq's expiry would leave it.
    await redis.zadd(QUEUE_NAME, {claim: time.time() * 1000})
    sweep = ClaimSweep(redis, store, executing=set, event_retention=60)
    report = await sweep.once()
    assert (report.dropped, report.released) == (0, 1)
    assert await redis.hget(ACTIVE_RUNS, conversation) is None  # type: ignore[misc]
    assert await redis.exists(run_key(claim), events_key(claim)) == 0
    assert await redis.hget(METRICS_KEY, counter_field(RUNS_FINISHED, status="failed")) is None  # type: ignore[misc]


async def test_a_run_taken_by_a_worker_that_died_before_recording_it_is_dropped(
    redis: Redis, store: RunStore
) -> None:
    """PostgreSQL, several workers: the taker named itself, then died before the run's row.

    Before: arq's in-progress marker (``job_timeout + 10 s``, a day) kept the run "taken",
    the sweep never treated it as gone, and the conversation answered 409 all that time.
    """
    dead = await _submitted(redis)
    live = await _submitted(redis)
    unnamed = await _submitted(redis)
    for job in (dead, live, unnamed):  # arq took each: its marker lives a day
        await redis.set(arq_in_progress_key(job.run_id), "1", px=(24 * 3600 + 10) * 1000)
    await redis.set(taken_key(dead.run_id), "host:1:gone")
    await redis.set(taken_key(live.run_id), "host:2:alive")
    await redis.set(worker_heartbeat_key("host:2:alive"), "{}", ex=10)

    sweep = ClaimSweep(redis, store, executing=set, event_retention=60)
    report = await sweep.once()
    assert report.dropped == 1
    assert await _claim(redis, dead) is None
    record = await redis.hgetall(run_key(dead.run_id))  # type: ignore[misc]
    assert record["status"] == "failed" and "stopped before recording" in record["error_message"]
    assert await redis.exists(arq_in_progress_key(dead.run_id), arq_job_key(dead.run_id)) == 0
    assert await redis.zscore(QUEUE_NAME, dead.run_id) is None  # arq never runs it a day later
    [(_, fields)] = await redis.xrange(events_key(dead.run_id))
    assert fields["type"] == "chat-error"
    for kept in (live, unnamed):  # a live taker records it; an unnamed one is left as it was
        assert await _claim(redis, kept) == kept.run_id


async def test_a_claim_taken_by_a_newer_run_is_never_released_for_an_older_one(redis: Redis) -> None:
    old = await _submitted(redis)
    await redis.delete(arq_job_key(old.run_id))
    await redis.zrem(QUEUE_NAME, old.run_id)
    # The conversation was freed and a new run of it accepted meanwhile.
    await redis.hdel(ACTIVE_RUNS, old.conversation_id)  # type: ignore[misc]
    new = _job(old.conversation_id)
    assert await submit_run(redis, new, title="newer") is None
    await redis.delete(arq_job_key(new.run_id))  # even were it gone itself

    assert not await drop_unstarted(
        redis, old.conversation_id, old.run_id, code="INTERRUPTED", message="no", event_retention=60
    )
    assert await _claim(redis, new) == new.run_id
    assert await redis.exists(events_key(old.run_id)) == 0
    assert "status" not in await redis.hgetall(run_key(old.run_id))  # type: ignore[misc]


async def test_the_cancelled_index_loses_entries_whose_record_expired(redis: Redis, store: RunStore) -> None:
    now_ms = time.time() * 1000
    alive, expired, ancient = (str(uuid.uuid4()) for _ in range(3))
    await redis.zadd(CANCELLED_RUNS, {alive: now_ms, expired: now_ms - 1000})
    await redis.hset(run_key(alive), mapping={"conversation": "c", "status": "cancelled"})  # type: ignore[misc]
    await redis.expire(run_key(alive), 600)
    # Enqueued longer ago than any record can live: dropped whatever Redis still holds.
    await redis.zadd(CANCELLED_RUNS, {ancient: now_ms - (CANCELLED_RETENTION_SECONDS + 2 * 86400) * 1000})
    await redis.hset(run_key(ancient), mapping={"conversation": "c", "status": "cancelled"})  # type: ignore[misc]

    report = await ClaimSweep(redis, store, executing=set, event_retention=60).once()
    assert report.pruned == 2
    assert await redis.zrange(CANCELLED_RUNS, 0, -1) == [alive]


async def test_the_sweep_runs_by_itself_in_the_background(redis: Redis, store: RunStore) -> None:
    job = await _submitted(redis)
    await redis.delete(arq_job_key(job.run_id))
    sweep = ClaimSweep(redis, store, executing=set, event_retention=60, interval=0.05)
    sweep.start()
    try:

        async def released() -> bool:
            return await _claim(redis, job) is None

        await wait_for_async(released, timeout=10, message="the background sweep released the claim")
    finally:
        await sweep.stop()
    assert (await redis.hgetall(run_key(job.run_id)))["status"] == "failed"  # type: ignore[misc]
