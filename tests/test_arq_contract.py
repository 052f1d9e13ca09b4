"""What worker/queue/wakeup.py relies on in arq, checked so an arq upgrade cannot change it unseen.

``WakeableWorker`` takes jobs through ``HookedWorker`` (worker/queue/compat.py), whose ``start_jobs`` is
a copy of arq 0.28.0's private ``Worker.start_jobs`` with the WATCH/EXISTS/ZSCORE/MULTI hand-off
replaced by one script. The source of the arq code it copies and the names it uses are checked
in tests/fast/test_compat.py; here, its behaviour against real Redis: arq's own ``Worker`` and
``WakeableWorker`` take the same jobs in the same cases (due, deferred, already in progress,
gone, over ``max_jobs``), and both mark a taken job in progress with arq's key and TTL.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from arq import create_pool
from arq.connections import ArqRedis, RedisSettings
from arq.constants import in_progress_key_prefix
from arq.worker import Worker, func

from tests.support.redis_server import RedisServer
from worker.queue.wakeup import WakeableWorker

# --- behaviour against real Redis ---------------------------------------------------------------


async def _job(ctx: dict[str, Any], label: str) -> str:
    ctx["ran"].append(label)
    await ctx["release"].wait()
    return label


@pytest.fixture
async def pool(redis_server: RedisServer) -> AsyncIterator[ArqRedis]:
    arq_pool = await create_pool(RedisSettings.from_dsn(redis_server.url))
    await arq_pool.flushall()
    yield arq_pool
    await arq_pool.aclose()


async def _take(kind: type[Worker], pool: ArqRedis, queue: str, *, max_jobs: int) -> dict[str, Any]:
    """Enqueue the five cases on ``queue``, let a ``kind`` worker's start_jobs see them, report."""
    ran: list[str] = []
    release = asyncio.Event()
    worker = kind(
        functions=[func(_job, name="job")], redis_pool=pool, queue_name=queue, handle_signals=False,
        max_jobs=max_jobs, keep_result=0, ctx={"ran": ran, "release": release},
    )
    for label in ("due", "taken", "second"):
        await pool.enqueue_job("job", label, _job_id=f"{queue}-{label}", _queue_name=queue)
    await pool.enqueue_job("job", "later", _job_id=f"{queue}-later", _queue_name=queue, _defer_by=3600)
    await pool.set(in_progress_key_prefix + f"{queue}-taken", b"1")  # another worker has it
    ids = [f"{queue}-{label}".encode() for label in ("due", "taken", "later", "gone", "second")]
    await worker.start_jobs(ids)
    started = sorted(job_id.removeprefix(f"{queue}-") for job_id in worker.tasks)
    await asyncio.sleep(0)  # the started tasks run up to the job function
    ttl = await pool.pttl(in_progress_key_prefix + f"{queue}-due")
    release.set()
    await asyncio.gather(*worker.tasks.values())
    return {
        "started": started,
        "ran": sorted(ran),
        "counter_after": worker.job_counter,
        "in_progress_ttl_ms": ttl,
        "timeout_ms": int(worker.in_progress_timeout_s * 1000),
    }


@pytest.mark.parametrize("max_jobs", [1, 4])
async def test_wakeable_worker_takes_the_jobs_arq_takes(pool: ArqRedis, max_jobs: int) -> None:
    arq_taken = await _take(Worker, pool, "arq-queue", max_jobs=max_jobs)
    ours = await _take(WakeableWorker, pool, "our-queue", max_jobs=max_jobs)
    expected = ["due"] if max_jobs == 1 else ["due", "second"]
    for report in (arq_taken, ours):
        assert report["started"] == expected and report["ran"] == expected
        assert report["counter_after"] == 0
        # marked in progress with arq's key, for arq's in-progress timeout
        assert 0 < report["in_progress_ttl_ms"] <= report["timeout_ms"]
    assert {k: v for k, v in ours.items() if k != "in_progress_ttl_ms"} == {
        k: v for k, v in arq_taken.items() if k != "in_progress_ttl_ms"
    }
