"""arq's queue read a page at a time: what a page of ``/api/runs`` and a ``/metrics`` scrape cost
does not grow with the queue (DESIGN.md, "Growing with the work").

A page is a window of the queue, newest first from the cursor (``ZREVRANGEBYSCORE`` with a
limit); a run's position is its rank (``ZRANK``) less the jobs ahead of it that are not waiting
runs: a rename, a delete or a webhook delivery (counted in Redis over their ids alone,
``QUEUE_RANKS_LUA``), and the runs that started (their jobs stay in arq's queue until they end:
the rows recorded running, a few per worker). When a page is for one conversation or one user,
their runs are looked up where they are kept (the conversation's claim and waiting list, the
user's active runs) instead of paging through everyone's.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from redis.asyncio import Redis

from shared.redis.keys import (
    ACTIVE_RUNS,
    QUEUE_NAME,
    QUEUED_BEHIND,
    QUEUED_READY,
    arq_in_progress_key,
    arq_job_key,
    user_runs_key,
    waiting_key,
)
from shared.redis.scripts import scripts


@dataclass(frozen=True, slots=True)
class QueueEntry:
    run_id: str
    enqueued_ms: float
    #: its place in the queue (0: first), when read with a window of it
    rank: int | None = None


def is_run(job_id: str) -> bool:
    """A run's job id is its UUID; the other jobs' ids are prefixed (``rename:``, ``delete:``, ...)."""
    return ":" not in job_id


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def window(redis: Redis, *, before_ms: float | None, offset: int, count: int) -> list[QueueEntry]:
    """Up to ``count`` jobs of the queue, newest first, enqueued at or before ``before_ms``,
    skipping the first ``offset`` of them."""
    high = "+inf" if before_ms is None else repr(before_ms)
    # With the queue's length and the jobs above the window, in one transaction: each entry's rank.
    async with redis.pipeline(transaction=True) as pipe:
        pipe.zcard(QUEUE_NAME)
        pipe.zcount(QUEUE_NAME, f"({high}" if before_ms is not None else "+inf", "+inf")
        pipe.zrevrangebyscore(QUEUE_NAME, high, "-inf", start=offset, num=count, withscores=True)
        total, above, members = await pipe.execute()
    first = int(total) - 1 - int(above) - offset
    return [
        QueueEntry(_text(job_id), float(score), first - i) for i, (job_id, score) in enumerate(members)
    ]


async def entries(redis: Redis, run_ids: Collection[str]) -> list[QueueEntry]:
    """Those of ``run_ids`` that are in the queue, newest first (one round trip)."""
    ids = list(dict.fromkeys(run_ids))
    if not ids:
        return []
    scores = await redis.zmscore(QUEUE_NAME, ids)
    pairs = zip(ids, scores, strict=True)
    found = [QueueEntry(run_id, float(score)) for run_id, score in pairs if score is not None]
    return sorted(found, key=lambda e: (e.enqueued_ms, e.run_id), reverse=True)


async def of_conversation(redis: Redis, conversation_id: str) -> list[str]:
    """The runs that may be queued for ``conversation_id``: its claim's holder and its waiting list."""
    async with redis.pipeline(transaction=False) as pipe:
        pipe.hget(ACTIVE_RUNS, conversation_id)
        pipe.lrange(waiting_key(conversation_id), 0, -1)
        holder, waiting = await pipe.execute()
    return [_text(r) for r in ([holder] if holder else []) + list(waiting)]


async def of_owner(redis: Redis, owner: str) -> list[str]:
    """The runs ``owner`` has queued or running (``user_runs_key``, at most their active-run limit)."""
    return [_text(r) for r in await redis.smembers(user_runs_key(owner))]  # type: ignore[misc]


async def positions(
    redis: Redis, run_ids: list[str], started: Collection[str], known: dict[str, int] | None = None
) -> dict[str, int]:
    """The position of each of ``run_ids`` still queued: the waiting runs ahead of it (0: next).

    ``started``: runs known to have started (their jobs are still queued, but nobody waits on them);
    ``known``: ranks already read with a window of the queue (not asked again).
    """
    known = known or {}
    others = [s for s in dict.fromkeys(started) if s not in set(run_ids)]
    asked = [*run_ids, *others]
    if not asked:
        return {}
    args = [f"#{known[job_id]}" if job_id in known else job_id for job_id in asked]
    replies = await scripts(redis).queue_ranks(keys=[QUEUE_NAME], args=args)
    ranks = {job_id: (int(rank), int(ahead)) for job_id, (rank, ahead) in zip(asked, replies, strict=True)}
    started_ranks = sorted(ranks[s][0] for s in dict.fromkeys(started) if s in ranks and ranks[s][0] >= 0)
    found = {}
    for run_id in run_ids:
        rank, ahead = ranks[run_id]
        if rank >= 0:
            found[run_id] = rank - ahead - sum(1 for r in started_ranks if r < rank)
    return found


@dataclass(frozen=True, slots=True)
class Figures:
    """The queue as a scrape reports it."""

    #: runs queued and not started
    queued: int
    #: of them, the runs waiting behind another run of their conversation
    behind: int
    #: when the oldest of the others was enqueued (s); None when there is none
    oldest_enqueued_at: float | None


#: at most this many runs whose job vanished are pruned from each end of the index per scrape
PRUNED_PER_SCRAPE = 100


async def figures(redis: Redis) -> Figures:
    """The queue's figures, from the index of queued runs the scripts keep (``QUEUED_READY``,
    ``QUEUED_BEHIND``): two ZCARDs and the oldest entry, whatever the queue's length."""
    reply = await scripts(redis).queue_figures(
        keys=[QUEUED_READY, QUEUED_BEHIND],
        args=[arq_job_key(""), arq_in_progress_key(""), PRUNED_PER_SCRAPE],
    )
    count, behind, oldest_ms = (_text(v) for v in reply)
    return Figures(
        queued=int(count), behind=int(behind),
        oldest_enqueued_at=float(oldest_ms) / 1000 if oldest_ms else None,
    )
