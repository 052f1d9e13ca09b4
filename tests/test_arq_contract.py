"""What worker/wakeup.py relies on in arq, checked so an arq upgrade cannot change it unseen.

``WakeableWorker.start_jobs`` is a copy of arq 0.28.0's private ``Worker.start_jobs`` with the
WATCH/EXISTS/ZSCORE/MULTI hand-off replaced by one script. Two kinds of check:

- the source of the arq methods it copies or calls through (``start_jobs``, ``_poll_iteration``,
  ``_release_sem_dec_counter_on_complete``) hashes to what it was when the copy was made, and the
  names and signatures it uses are there; a new arq fails here first, and whoever upgrades reads
  the new ``start_jobs`` and brings the copy in line (then updates the hashes);
- behaviour, against real Redis: arq's own ``Worker`` and ``WakeableWorker`` take the same jobs
  in the same cases (due, deferred, already in progress, gone, over ``max_jobs``), and both mark
  a taken job in progress with arq's key and TTL.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
from collections.abc import AsyncIterator
from importlib.metadata import version
from typing import Any

import pytest
from arq import create_pool
from arq.connections import ArqRedis, RedisSettings
from arq.constants import in_progress_key_prefix
from arq.worker import Worker, func

from tests.support.redis_server import RedisServer
from worker.wakeup import WakeableWorker

ARQ_VERSION = "0.28.0"

#: sha256 of ``inspect.getsource`` of each arq method, as of ARQ_VERSION.
SOURCE_HASHES = {
    # copied by WakeableWorker.start_jobs
    "start_jobs": "b45797cfa40bed7fe6e9b8b8100c5f5b4144fe85112155c4e355df6ed8521f5f",
    # called through super() by WakeableWorker._poll_iteration: reads the queue, calls start_jobs
    "_poll_iteration": "f8d39d823a0a59f27a45f1c0e80bee44e16219d5072235fbc81866402298322f",
    # the done-callback the copy attaches to each job's task
    "_release_sem_dec_counter_on_complete": (
        "0ed101482e942c33a64ccbe19eb3c4d29da9497258b1ffb1380da300da9bc481"
    ),
}


def test_arq_is_the_pinned_version() -> None:
    assert version("arq") == ARQ_VERSION, "worker/wakeup.py mirrors arq 0.28.0: re-read start_jobs first"


@pytest.mark.parametrize("name", sorted(SOURCE_HASHES))
def test_the_arq_code_wakeup_mirrors_is_unchanged(name: str) -> None:
    source = inspect.getsource(getattr(Worker, name))
    assert hashlib.sha256(source.encode()).hexdigest() == SOURCE_HASHES[name], (
        f"arq's Worker.{name} changed: compare it with WakeableWorker (worker/wakeup.py)"
    )


def test_the_names_the_copy_uses_are_there() -> None:
    assert in_progress_key_prefix == "arq:in-progress:"
    assert list(inspect.signature(Worker.run_job).parameters) == ["self", "job_id", "score"]
    assert list(inspect.signature(Worker.start_jobs).parameters) == ["self", "job_ids"]
    worker = Worker(functions=[func(_job, name="job")], redis_pool=None, queue_name="q", handle_signals=False)
    for attribute in ("sem", "job_counter", "max_jobs", "in_progress_timeout_s", "queue_name", "tasks",
                      "loop", "allow_pick_jobs"):
        assert hasattr(worker, attribute), attribute
    assert isinstance(worker.sem, asyncio.BoundedSemaphore)


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
