"""The outcome of a job an API request waits on: the worker pushes one word, the request pops it.

The writes the API hands to the worker (a cron's, an assistant's, a thread's copy, a rename, a
delete) are jobs, and the request that enqueued one waits for it, bounded, on a list named for
the job. The worker pushes the job's outcome there once the database is written (persist, then
notify): the word the job names for success (``done``, ``renamed``, …), one for a target gone
meanwhile (``missing``, ``gone``), or ``failed: <why>``. The list is kept briefly; a request that
gave up waiting reads the database instead.
"""

from __future__ import annotations

from typing import Any

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

log = structlog.get_logger(__name__)

#: How long an outcome is kept for the request waiting on it.
OUTCOME_TTL_SECONDS = 60
#: The outcome of a job whose worker stopped before it ended (cancelled, shut down).
STOPPED = "failed: the worker stopped"


def failure(exc: BaseException) -> str:
    """The outcome of a job that raised ``exc``."""
    return f"failed: {type(exc).__name__}: {exc}"


def push(pipe: Any, key: str, outcome: str) -> None:
    """Queue the outcome's push on ``pipe`` (a job that writes more in the same transaction)."""
    pipe.rpush(key, outcome)
    pipe.expire(key, OUTCOME_TTL_SECONDS)


async def report(redis: Redis, key: str, outcome: str, *, event: str) -> None:
    """Push ``outcome`` for the request waiting on ``key``; a Redis error is logged as ``event``:
    the request answered already or will, from the database the job wrote."""
    try:
        async with redis.pipeline(transaction=True) as pipe:
            push(pipe, key, outcome)
            await pipe.execute()
    except RedisError as exc:
        log.warning(event, error=str(exc))


async def awaited(redis: Redis, key: str, seconds: float) -> str | None:
    """The outcome pushed to ``key`` within ``seconds``, taken off the list (None: none yet)."""
    reply = await redis.blpop([key], timeout=seconds)  # type: ignore[misc, arg-type]  # float timeouts work on Redis >= 6
    if reply is None:
        return None
    value = reply[1]
    return value.decode() if isinstance(value, bytes) else str(value)
