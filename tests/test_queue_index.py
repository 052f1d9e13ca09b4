"""The index of queued runs a ``/metrics`` scrape counts (issue 44: a scrape in O(1) of the queue).

Real Redis, no process: the scripts that move a run are run as the API and the worker run them
(submit, take, an ending, the wake of the next turn, the turn's claim, the start-up recovery's
requeue), and after each step the scrape's figures (api/runs/queue.py ``figures``) say what the
queue holds: the runs queued, those waiting for their thread, the oldest of the others. A run whose
job vanished (arq dropped it) is pruned by the scrape.
"""

from __future__ import annotations

import time
import uuid

from redis.asyncio import Redis

from api.runs import queue
from shared.contracts.jobs import JobKind, RunJob
from shared.contracts.runs import RunStatus
from shared.contracts.webhooks import hook_keys_args
from shared.redis.keys import (
    ACTIVE_RUNS,
    OWNERS_TAKEN,
    QUEUE_NAME,
    arq_in_progress_key,
    arq_job_key,
    events_key,
    run_key,
    taken_key,
    waiting_key,
)
from shared.redis.metrics import METRICS_KEY, RUNS_FINISHED, counter_field
from shared.redis.queue import requeued, submit
from shared.redis.scripts import scripts


def job(conversation: str, enqueued_at: float, *, may_wait: bool = False) -> RunJob:
    return RunJob(
        run_id=str(uuid.uuid4()), conversation_id=conversation, kind=JobKind.RUN, message="hi",
        enqueued_at=enqueued_at, new_conversation=False, may_wait=may_wait,
    )


async def take(redis: Redis, run_id: str) -> None:
    """The worker's take of a job (worker/queue/wakeup.py)."""
    score = await scripts(redis).take(
        keys=[arq_in_progress_key(run_id), QUEUE_NAME, OWNERS_TAKEN, run_key(run_id)],
        args=[run_id, int(time.time() * 1000) + 10_000_000, 60_000],
    )
    assert score is not None


async def end(redis: Redis, run: RunJob) -> None:
    """The worker's ending of a run (worker/run/outcome/ending.py), then the wake of the next turn."""
    hook_keys, hook_args = hook_keys_args(run.run_id, run.conversation_id)
    await scripts(redis).end_run(
        keys=[ACTIVE_RUNS, events_key(run.run_id), METRICS_KEY, *hook_keys],
        args=[
            run.conversation_id, run.run_id, "completed", "", "", "", "1", "60",
            counter_field(RUNS_FINISHED, status=RunStatus.COMPLETED.value), *hook_args,
        ],
    )
    await scripts(redis).wake_next_turn(
        keys=[waiting_key(run.conversation_id), QUEUE_NAME, "sophos:wake"], args=[int(time.time() * 1000)]
    )


async def claim_turn(redis: Redis, run: RunJob) -> str:
    reply = await scripts(redis).claim_turn(
        keys=[ACTIVE_RUNS, waiting_key(run.conversation_id), taken_key(run.run_id)],
        args=[run.conversation_id, run.run_id, "", 60],
    )
    return str(reply[0])


def ms(at: float) -> float:
    """``at`` as the index keeps it: the enqueue time of the run's description, to the millisecond."""
    return int(float(f"{at:.6f}") * 1000) / 1000


async def figures(redis: Redis) -> tuple[int, int, float | None]:
    f = await queue.figures(redis)
    return f.queued, f.behind, f.oldest_enqueued_at


async def test_the_scrape_counts_the_queue_from_its_index_as_runs_move(redis: Redis) -> None:
    base = time.time() - 100
    busy = str(uuid.uuid4())
    holder = job(busy, base)
    second, third = job(busy, base + 1, may_wait=True), job(busy, base + 2, may_wait=True)
    alone = [job(str(uuid.uuid4()), base + 10 + i) for i in range(3)]
    assert (await submit(redis, holder, title="t")).behind is None
    for run in (second, third):
        assert (await submit(redis, run, title="t", enqueue=True)).behind is not None
    for run in alone:
        assert (await submit(redis, run, title="t")).holder is None
    # Two wait for their thread; the oldest of the others is the holder.
    assert await figures(redis) == (6, 2, ms(base))

    await take(redis, holder.run_id)  # started: no longer queued
    assert await figures(redis) == (5, 2, ms(base + 10))
    await take(redis, second.run_id)  # taken only to be deferred: still waiting for its thread
    assert await claim_turn(redis, second) == "behind"
    await redis.delete(arq_in_progress_key(second.run_id))
    assert await figures(redis) == (5, 2, ms(base + 10))

    await end(redis, holder)  # its thread free: the next waits for a worker now, with its own age
    assert await figures(redis) == (5, 1, ms(base + 1))
    await take(redis, second.run_id)
    assert await claim_turn(redis, second) == "claimed"
    assert await figures(redis) == (4, 1, ms(base + 10))

    # arq dropped the oldest's job: the scrape prunes it.
    await redis.delete(arq_job_key(alone[0].run_id))
    assert await figures(redis) == (3, 1, ms(base + 11))

    # Taken by a worker that died before starting it: the recovery gives it back.
    await take(redis, alone[1].run_id)
    assert await figures(redis) == (2, 1, ms(base + 12))
    await redis.delete(arq_in_progress_key(alone[1].run_id))
    await requeued(redis, alone[1].run_id)
    assert await figures(redis) == (3, 1, ms(base + 11))

    # Ended while queued (a cancel, the sweep's drop: the one ending): gone from the figures.
    await end(redis, third)
    await end(redis, alone[1])
    await end(redis, alone[2])
    assert await figures(redis) == (0, 0, None)
