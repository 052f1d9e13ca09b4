"""Figures measured on event streams alone, with no worker running: 3 (relay latency) and the
API half of 6 (resident memory with 200 open streams).

Runs are claimed with ``shared.redis.queue.submit_run`` exactly as the API does, and stay
queued (no worker takes them); the benchmark then writes their events itself with
XADD, entry ids ``<n>-0`` and fields ``type``/``data``, as the worker would.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis

from bench.client import BenchError, Client, http_client, sse
from bench.stack import cpu_seconds, rss_bytes
from shared.contracts.codec import dumps
from shared.contracts.jobs import JobKind, RunJob
from shared.redis.keys import ACTIVE_RUNS, QUEUE_NAME, arq_job_key, events_key, run_key
from shared.redis.queue import submit_run

END_WAIT_SECONDS = 30.0


async def claim_queued_run(redis: Redis) -> RunJob:
    job = RunJob(
        run_id=str(uuid.uuid4()),
        conversation_id=str(uuid.uuid4()),
        kind=JobKind.RUN,
        message="stream probe",
        enqueued_at=time.time(),
        new_conversation=True,
    )
    holder = await submit_run(redis, job, title="stream probe")
    if holder is not None:
        raise BenchError(f"conversation {job.conversation_id} unexpectedly held by {holder}")
    return job


async def forget_runs(redis: Redis, jobs: list[RunJob]) -> None:
    """Take the probe runs out of the queue so that no worker ever runs them."""
    async with redis.pipeline(transaction=False) as pipe:
        for job in jobs:
            pipe.zrem(QUEUE_NAME, job.run_id)
            pipe.hdel(ACTIVE_RUNS, job.conversation_id)
            pipe.delete(arq_job_key(job.run_id), run_key(job.run_id), events_key(job.run_id))
        await pipe.execute()


def _end_fields(job: RunJob) -> dict[Any, Any]:
    return {
        "type": "end",
        "data": dumps({"conversation": job.conversation_id, "run": job.run_id, "status": "completed"}),
    }


@dataclass
class Relay:
    relay_ms: list[float] = field(default_factory=list)
    ping_ms: list[float] = field(default_factory=list)
    #: CPU seconds per process role over the measured samples
    cpu: dict[str, float] = field(default_factory=dict)


async def relay(
    http: Client,
    redis: Redis,
    samples: int,
    rng: random.Random,
    *,
    warm: int = 5,
    cpu: Callable[[], dict[str, float]] = dict,
) -> Relay:
    """Figure 3: XADD a ``token`` stamped with time.time(); time until the SSE client parses it.

    Interleaved with a Redis PING from the same client, the floor of any relay.
    """
    job = await claim_queued_run(redis)
    key = events_key(job.run_id)
    result = Relay()
    received: asyncio.Queue[tuple[float, str]] = asyncio.Queue()
    try:
        async with sse(http, job.conversation_id) as events:

            async def read() -> None:
                async for event in events:
                    if event.event == "token":
                        received.put_nowait((time.time(), event.data))
                    elif event.event == "end":
                        return

            reader = asyncio.create_task(read())
            try:
                cpu_before: dict[str, float] = {}
                for n in range(1, warm + samples + 1):
                    if n == warm + 1:
                        cpu_before = cpu()
                    started = time.perf_counter()
                    await redis.ping()
                    ping = (time.perf_counter() - started) * 1000
                    sent = time.time()
                    await redis.xadd(key, {"type": "token", "data": dumps(f"{sent:.6f}")}, id=f"{n}-0")
                    at, data = await asyncio.wait_for(received.get(), END_WAIT_SECONDS)
                    if n > warm:
                        result.relay_ms.append((at - float(data)) * 1000)
                        result.ping_ms.append(ping)
                    await asyncio.sleep(rng.uniform(0.001, 0.005))
                cpu_after = cpu()
                result.cpu = {role: cpu_after[role] - cpu_before.get(role, 0.0) for role in cpu_after}
                await redis.xadd(key, _end_fields(job), id=f"{warm + samples + 1}-0")
                await asyncio.wait_for(reader, END_WAIT_SECONDS)
            finally:
                reader.cancel()
                with contextlib.suppress(BaseException):
                    await reader
    finally:
        await forget_runs(redis, [job])
    return result


@dataclass
class ApiStreams:
    streams: int
    rss_idle: int
    rss_open: int
    hwm_open: int
    rss_closed: int
    open_seconds: float
    #: one event XADDed to every stream at once: time until each client parsed it
    fanout_ms: list[float] = field(default_factory=list)
    #: the API process's CPU (user + system) from that event's XADD until every client parsed it
    fanout_cpu_s: float = 0.0
    #: streams that relayed the probe event within END_WAIT_SECONDS (``fanout_ms`` counts those that
    #: had it later too), and that ended with their end event
    probed: int = 0
    ended: int = 0


async def api_streams(
    api_url: str, api_pid: int, redis: Redis, n: int, at_open: Callable[[], None] | None = None,
    *, require_all: bool = True,
) -> ApiStreams:
    """Figure 6 (API): ``n`` clients each subscribed to a queued run of its own; ``at_open`` is
    called while all are open and have relayed an event (figure 15 measures the tree then).
    ``require_all=False`` (figure 26): streams that miss the probe or their end are counted, not
    a failure, and ``at_open`` is called once the probe's wait is over."""
    rss_idle, _ = rss_bytes(api_pid)
    jobs = [await claim_queued_run(redis) for _ in range(n)]
    opened = 0
    all_open = asyncio.Event()
    probe_at: dict[str, float] = {}
    all_probed = asyncio.Event()
    ended = 0
    try:
        async with http_client(api_url, connections=n + 16) as http:
            failures: list[BaseException] = []

            async def subscriber(job: RunJob) -> None:
                nonlocal opened, ended
                try:
                    async with sse(http, job.conversation_id) as events:
                        opened += 1
                        if opened == n:
                            all_open.set()
                        async for event in events:
                            if event.event == "token":
                                probe_at[job.run_id] = time.time()
                                if len(probe_at) == n:
                                    all_probed.set()
                            elif event.event == "end":
                                ended += 1
                                return
                except Exception as exc:
                    failures.append(exc)
                    all_open.set()
                    raise

            tasks = [asyncio.create_task(subscriber(job)) for job in jobs]
            try:
                started = time.perf_counter()
                await asyncio.wait_for(all_open.wait(), 120)
                if failures:
                    raise BenchError(f"{len(failures)} of {n} streams failed, the first: {failures[0]}")
                open_seconds = time.perf_counter() - started
                await asyncio.sleep(1.0)  # every relay is now blocked in XREAD
                cpu_before = cpu_seconds(api_pid)
                sent = time.time()
                async with redis.pipeline(transaction=False) as pipe:
                    for job in jobs:
                        pipe.xadd(events_key(job.run_id), {"type": "token", "data": dumps("probe")}, id="1-0")
                    await pipe.execute()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(all_probed.wait(), END_WAIT_SECONDS)
                fanout_cpu_s = cpu_seconds(api_pid) - cpu_before
                probed = len(probe_at)  # within the wait (some may have it later)
                if len(probe_at) < n and require_all:
                    raise BenchError(f"only {len(probe_at)} of {n} open streams relayed the probe event")
                rss_open, hwm_open = rss_bytes(api_pid)
                if at_open is not None:
                    at_open()
                async with redis.pipeline(transaction=False) as pipe:
                    for job in jobs:
                        pipe.xadd(events_key(job.run_id), _end_fields(job), id="2-0")
                    await pipe.execute()
                try:
                    await asyncio.wait_for(asyncio.gather(*tasks), END_WAIT_SECONDS)
                except TimeoutError:
                    if require_all:
                        raise
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        if ended != n and require_all:
            raise BenchError(f"{ended} of {n} streams ended with their end event")
        await asyncio.sleep(1.0)
        rss_closed, _ = rss_bytes(api_pid)
    finally:
        await forget_runs(redis, jobs)
    return ApiStreams(
        streams=n,
        rss_idle=rss_idle,
        rss_open=rss_open,
        hwm_open=hwm_open,
        rss_closed=rss_closed,
        open_seconds=open_seconds,
        fanout_ms=[(at - sent) * 1000 for at in probe_at.values()],
        fanout_cpu_s=fanout_cpu_s,
        probed=probed,
        ended=ended,
    )
