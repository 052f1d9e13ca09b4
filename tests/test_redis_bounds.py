"""Bounded Redis (issue 11, part 4): every key the service writes has a bound.

A few hundred runs (some with an ``Idempotency-Key``), cancels of queued and of
running runs, failures, a job that expires in the queue and a run the database
refuses, through the real worker and API; then every key of the test's Redis is
listed with ``SCAN`` and each must have a TTL, or be one of the structures named
in :data:`BOUNDED` and hold to the bound given there.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable

import httpx
import pytest
import redis as redis_sync

from shared.contracts.runs import RunStatus
from shared.redis.keys import (
    ACTIVE_RUNS,
    CANCELLED_RETENTION_SECONDS,
    CANCELLED_RUNS,
    OWNERS_TAKEN,
    QUEUE_NAME,
    WAKE_LIST,
    WORKER_LAST_BEAT,
    arq_in_progress_key,
    arq_job_key,
    run_key,
)
from shared.redis.metrics import (
    BUCKETS,
    CHECKPOINT_WRITE,
    FIRST_TOKEN,
    METRICS_KEY,
    MODEL_CALL,
    MODEL_CALLS_REPEATED,
    QUEUE_WAIT,
    REPEAT_REASONS,
    RUN_DURATION,
    RUNS_FINISHED,
    TOOL_CALL,
    TOOL_CALL_OUTCOMES,
    TOOL_CALLS,
    TOOL_CALLS_REPEATED,
)
from tests.fakes.ollama import FakeOllama, Hang, Status, ToolCalls
from tests.support.client import get_json, wait_for
from tests.support.env import SophosEnv
from tests.support.faults import DatabaseLock, accepted
from tests.support.http import async_http_client, http_client
from worker.upkeep.sweep import SWEEP_SECONDS

RUNS = 240
#: Runs cancelled while queued, and while running.
QUEUED_CANCELS = 4
#: The longest TTL the service gives a key: the record of a run that ended without a row.
LONGEST_TTL_SECONDS = CANCELLED_RETENTION_SECONDS
#: The submit script trims the wake-up list to this many entries.
WAKE_LIST_BOUND = 16
TOOLS = ("tools__echo", "tools__add", "tools__slow", "tools__fail")
#: Histogram buckets and the two other parts (count, sum) of one label set.
_PARTS = {metric: len(bounds) + 3 for metric, bounds in BUCKETS.items()}
#: the histograms without labels
_UNLABELLED = (QUEUE_WAIT, FIRST_TOKEN, MODEL_CALL, CHECKPOINT_WRITE)
_FINISHED = len([s for s in RunStatus if s.finished])
METRICS_FIELDS_BOUND = (
    _FINISHED + _PARTS[RUN_DURATION] * _FINISHED + sum(_PARTS[m] for m in _UNLABELLED)
    + _PARTS[TOOL_CALL] * len(TOOLS) + len(TOOL_CALL_OUTCOMES) + len(REPEAT_REASONS)
    + 1  # MODEL_CALLS_REPEATED
)


def _metrics_field_known(field: str) -> bool:
    metric, labels, part = json.loads(field)
    if metric in (RUNS_FINISHED, RUN_DURATION):
        return (part == "total") == (metric == RUNS_FINISHED) and RunStatus(labels["status"]).finished
    if metric in _UNLABELLED:
        return labels == {}
    if metric == TOOL_CALLS:
        return part == "total" and labels.get("outcome") in TOOL_CALL_OUTCOMES
    if metric == TOOL_CALLS_REPEATED:
        return part == "total" and labels.get("reason") in REPEAT_REASONS
    if metric == MODEL_CALLS_REPEATED:
        return part == "total" and labels == {}
    return metric == TOOL_CALL and labels.get("tool") in TOOLS


#: Keys without a TTL, what bounds each, and the check of that bound once every run has ended.
BOUNDED: dict[str, tuple[str, Callable[[redis_sync.Redis], bool]]] = {
    QUEUE_NAME: (
        "arq's queue: a run leaves it when arq runs or drops its job (the sweep drops one whose "
        "record expired): once no run is waiting, it is empty",
        lambda r: r.zcard(QUEUE_NAME) == 0,
    ),
    ACTIVE_RUNS: (
        "one field per conversation with a queued or running run (the sweep releases the rest): "
        "once every run has ended, none",
        lambda r: r.hlen(ACTIVE_RUNS) == 0,
    ),
    METRICS_KEY: (
        "a fixed set of fields: a counter per outcome, histogram buckets per metric and tool",
        lambda r: all(_metrics_field_known(f) for f in r.hkeys(METRICS_KEY))
        and r.hlen(METRICS_KEY) <= METRICS_FIELDS_BOUND,
    ),
    WORKER_LAST_BEAT: (
        "one string, rewritten by every heartbeat", lambda r: r.type(WORKER_LAST_BEAT) == "string"
    ),
    WAKE_LIST: (
        f"trimmed to {WAKE_LIST_BOUND} entries by the submit script, emptied by the worker's BLPOP",
        lambda r: r.llen(WAKE_LIST) <= WAKE_LIST_BOUND,
    ),
    OWNERS_TAKEN: (
        "one field per user a worker took a run of (the fair order, worker/queue/fair.py): as many as "
        "there are users; here the one local user",
        lambda r: set(r.hkeys(OWNERS_TAKEN)) <= {"local"},
    ),
    CANCELLED_RUNS: (
        "one entry per run cancelled while queued whose record is still kept (the sweep prunes "
        "the others)",
        lambda r: all(
            r.hget(run_key(m), "status") == "cancelled" and r.ttl(run_key(m)) > 0
            for m in r.zrange(CANCELLED_RUNS, 0, -1)
        ),
    ),
}


@pytest.fixture
def env(sophos_env: SophosEnv) -> SophosEnv:
    """No limit on submissions (but limited: its keys are written)."""
    return sophos_env.with_(RATE_LIMIT_PER_MINUTE=1_000_000)


def run_status(api_url: str, run_id: str) -> str | None:
    with http_client(base_url=api_url, timeout=10) as http:
        response = http.get(f"/api/runs/{run_id}")
    return None if response.status_code == 404 else str(response.json()["status"])


def wait_status(api_url: str, run_id: str, *statuses: str, timeout: float = 30.0) -> str:
    return wait_for(
        lambda: (s := run_status(api_url, run_id)) in statuses and s, timeout=timeout,
        message=lambda: f"run {run_id} {' or '.join(statuses)} (is {run_status(api_url, run_id)})",
    )


def cancel(api_url: str, run_id: str) -> int:
    with http_client(base_url=api_url, timeout=10) as http:
        return http.post(f"/api/runs/{run_id}/cancel").status_code


async def _many_runs(api_url: str, count: int) -> list[tuple[str, str]]:
    """``count`` new conversations at once (every fifth with an Idempotency-Key), 16 at a time."""
    gate = asyncio.Semaphore(16)

    async def one(i: int, http: httpx.AsyncClient) -> tuple[str, str]:
        headers = {"Idempotency-Key": str(uuid.uuid4())} if i % 5 == 0 else {}
        async with gate:
            response = await http.post("/api/chat", json={"message": f"hello {i}"}, headers=headers)
        assert response.status_code == 202, response.text
        return response.json()["conversation"], response.json()["run"]

    async with async_http_client(base_url=api_url, timeout=30) as http:
        return await asyncio.gather(*(one(i, http) for i in range(count)))


def _all_ended(api_url: str) -> bool:
    return all(get_json(api_url, "/api/runs", status=s)["runs"] == [] for s in ("queued", "running"))


def test_every_key_has_a_ttl_or_a_named_bound_after_hundreds_of_runs_cancels_and_failures(
    env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    start_worker(env)
    api = start_api(env).url
    client = redis_sync.Redis.from_url(env.redis_url, decode_responses=True)
    try:
        # Hundreds of runs, and a second message in some of the conversations.
        conversations = [c for c, _ in asyncio.run(_many_runs(api, RUNS))]
        wait_for(lambda: _all_ended(api), timeout=180, interval=0.5, message="the runs to end")
        for conversation in conversations[:20]:
            accepted(api, "and again", conversation)
        wait_for(lambda: _all_ended(api), timeout=60, interval=0.5, message="the second runs to end")

        # Cancels: one running (stopped at its next step boundary), some queued behind it.
        held = Hang(then=ToolCalls([("tools__add", {"a": 1, "b": 2})]))
        model.script(held)
        _, running = accepted(api, "cancel me while I run")
        held.wait_started(20)
        waiting = [accepted(api, f"queued {i}")[1] for i in range(QUEUED_CANCELS + 2)]
        cancelled = waiting[:QUEUED_CANCELS]
        for run in cancelled:
            assert cancel(api, run) == 200
        assert cancel(api, running) == 202
        held.release()
        wait_status(api, running, "cancelled")
        for run in waiting[QUEUED_CANCELS:]:
            wait_status(api, run, "completed")

        # Failures: the model fails, and a run's job expires while it waits in the queue.
        model.script(Status(500), Status(500), Status(500))
        failed = [accepted(api, f"fail {i}")[1] for i in range(3)]
        for run in failed:
            wait_status(api, run, "failed")
        busy = Hang(text="busy ")
        model.script(busy)
        _, holder = accepted(api, "hold the worker")
        busy.wait_started(20)
        _, expired = accepted(api, "expires")
        client.delete(arq_job_key(expired), run_key(expired))
        busy.release()
        wait_status(api, holder, "completed")
        wait_status(api, expired, "failed", timeout=SWEEP_SECONDS * 4)

        # A cancelled run's record expires: its index entry goes with the next sweeps.
        client.pexpire(run_key(cancelled[0]), 1)
        wait_for(
            lambda: client.zscore(CANCELLED_RUNS, cancelled[0]) is None, timeout=SWEEP_SECONDS * 4,
            message="the expired record's entry pruned from the cancelled index",
        )
        wait_for(lambda: _all_ended(api), timeout=30, interval=0.5, message="every run to end")
        # The last run's arq bookkeeping is written a moment after its end.
        wait_for(lambda: client.hlen(ACTIVE_RUNS) == 0 and client.zcard(QUEUE_NAME) == 0, timeout=10,
                 message=lambda: f"claims released: {client.hgetall(ACTIVE_RUNS)}")

        unbounded, broken, seen = [], [], set()
        for key in client.scan_iter(count=1000):
            seen.add(key)
            ttl = client.pttl(key)
            if ttl > 0:
                assert ttl <= LONGEST_TTL_SECONDS * 1000, (key, ttl)
            elif key in BOUNDED:
                if not BOUNDED[key][1](client):
                    broken.append((key, BOUNDED[key][0]))
            else:
                unbounded.append((key, client.type(key)))
        assert unbounded == [], f"keys without a TTL or a named bound: {unbounded[:20]}"
        assert broken == [], f"bounded structures over their bound: {broken}"
        # The workload wrote what it should have: the check above looked at real keys.
        for prefix in ("sophos:events:", "sophos:run:", "sophos:idem:", "sophos:ratelimit", "arq:result:"):
            assert any(k.startswith(prefix) for k in seen), prefix
        assert {METRICS_KEY, WORKER_LAST_BEAT, CANCELLED_RUNS} <= seen
        assert client.zcard(CANCELLED_RUNS) == QUEUED_CANCELS - 1
    finally:
        client.close()


def test_a_refused_run_keeps_a_bounded_record_even_after_its_description_expired(
    env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    """The worker took the run, the database refused it, and meanwhile its description expired:
    the record written then is still readable (it names its conversation) and still expires."""
    worker = start_worker(env)
    api = start_api(env).url
    accepted(api, "the database exists")
    wait_for(lambda: _all_ended(api), message="the first run to end")
    client = redis_sync.Redis.from_url(env.redis_url, decode_responses=True)
    try:
        with DatabaseLock(env.database_path):
            conversation, run = accepted(api, "refused")
            wait_for(lambda: client.exists(arq_in_progress_key(run)), message="the worker took the run")
            client.delete(run_key(run))  # as its TTL would, while the worker waits on the lock
            worker.wait_for_log(lambda line: run in line and "run.not_recorded" in line, timeout=30)
        record = client.hgetall(run_key(run))
        assert record["status"] == "failed" and record["conversation"] == conversation
        assert 0 < client.ttl(run_key(run)) <= LONGEST_TTL_SECONDS
        info = get_json(api, f"/api/runs/{run}")
        assert info["status"] == "failed" and info["error"]["code"] == "DATABASE_UNAVAILABLE"
    finally:
        client.close()
