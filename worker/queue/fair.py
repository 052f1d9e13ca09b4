"""Fair shares: which due job the worker takes first (DESIGN.md, "Fair shares").

arq hands the worker its due jobs in queue order, oldest first: a user who queued fifty runs
would hold everybody else back until the fifty are taken. The worker takes them round-robin
across owners instead: first each owner's oldest job, then each owner's second, and so on;
within a round, the owner served least recently goes first (the take script records when each
owner's run was last taken, ``OWNERS_TAKEN``, in Redis: so the rotation carries over from one
look at the queue to the next, and is one rotation for every worker). A run then waits behind at
most one queued run of each other user, however many they queued, on one worker or several
(taking stays atomic: worker/queue/wakeup.py).

A job's owner is in its run's Redis description (``run_key``, written by the submit script);
jobs that are not runs (a delete, a rename, a webhook) have none and are each an owner of their
own, never served before: they are never held back.

The order covers what arq reads in one look at the queue (``queue_read_limit``, at least 100
jobs); with ``USER_MAX_ACTIVE_RUNS`` at its default of 8 that is a dozen users at their limit.
"""

from __future__ import annotations

from collections.abc import Sequence

from redis.asyncio import Redis

from shared.redis.keys import OWNERS_TAKEN, run_key
from shared.redis.scripts import scripts


def round_robin(job_ids: Sequence[bytes], owners: Sequence[tuple[str, int]]) -> list[bytes]:
    """``job_ids`` (queue order) reordered: each owner's first job, then each one's second, …

    ``owners[i]`` is ``(owner, last take in ms)`` for ``job_ids[i]`` (owner ``""``: a job of its
    own). Within a round, the owner taken from least recently comes first, then queue order."""
    seen: dict[str, int] = {}
    ranked: list[tuple[int, int, int, bytes]] = []
    for position, (job_id, (owner, last_taken)) in enumerate(zip(job_ids, owners, strict=True)):
        rank = 0
        if owner:
            rank = seen.get(owner, 0)
            seen[owner] = rank + 1
        ranked.append((rank, last_taken, position, job_id))
    ranked.sort()
    return [job_id for *_, job_id in ranked]


async def fair_order(redis: Redis, job_ids: list[bytes]) -> list[bytes]:
    """``job_ids`` in the order to take them: one round trip for their owners and the owners' last
    takes, then :func:`round_robin`. A single job (or none) is returned as it is."""
    if len(job_ids) < 2:
        return job_ids
    rows = await scripts(redis).owners(keys=[OWNERS_TAKEN, *(run_key(j.decode()) for j in job_ids)])
    owners = [(_text(owner), int(_text(taken))) for owner, taken in rows]
    return round_robin(job_ids, owners)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
