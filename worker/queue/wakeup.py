"""An arq worker that sleeps on Redis instead of polling it, and takes a job in one round trip.

arq looks at its queue every ``poll_delay``: 0.5 s by default (~450 ms from
enqueue to start), and a 10 ms poll costs ~6 % of a core while idle. Here the
submit script pushes to ``WAKE_LIST`` and the idle worker waits on ``BLPOP``:
a job starts a Redis round trip after it is accepted, and an idle worker costs
nothing. The queue is still read on every wake-up and at least every
``idle_timeout``, so a missed wake-up delays a job, never loses it.

Taking a job: arq's ``start_jobs`` checks the job is still queued and not in
progress, then marks it in progress, with WATCH, EXISTS, ZSCORE and MULTI/EXEC:
four round trips on the path of every run (issue 6). :meth:`WakeableWorker.take` does the
same check-and-mark in one script, which is atomic where WATCH is optimistic. arq has no
hook for either; worker/queue/compat.py makes them (``HookedWorker``, on arq's private loop), and
tests/test_arq_contract.py fails when the worker stops taking the jobs arq's own would.

Which due job first: round-robin across the runs' owners (worker/queue/fair.py), not queue order.
"""

from __future__ import annotations

import asyncio
from typing import Any

from arq.connections import create_pool
from arq.constants import in_progress_key_prefix
from arq.utils import timestamp_ms
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from shared.redis.keys import OWNERS_TAKEN, WAKE_LIST, run_key
from shared.redis.scripts import scripts
from shared.speedups import use_parser
from worker.queue.compat import HookedWorker
from worker.queue.fair import fair_order


class WakeableWorker(HookedWorker):
    def __init__(
        self, *args: Any, idle_timeout: float = 1.0, parser_class: type[Any] | None = None, **kwargs: Any
    ) -> None:
        kwargs["poll_delay"] = 0  # the waiting happens in after_poll
        super().__init__(*args, **kwargs)
        self.idle_timeout = idle_timeout
        #: redis-py's reply parser for the pool (REDIS_PARSER); None: redis-py's default
        self.parser_class = parser_class
        self._take: AsyncScript | None = None

    async def main(self) -> None:
        if self.own_pool is None and self.parser_class is not None:
            # arq's create_pool takes no parser: the pool it makes is switched before use.
            self.own_pool = pool = await create_pool(
                self.redis_settings,
                job_deserializer=self.job_deserializer,
                job_serializer=self.job_serializer,
                default_queue_name=self.queue_name,
                expires_extra_ms=self.expires_extra_ms,
            )
            await use_parser(pool, self.parser_class)
        await super().main()

    async def take(self, job_id: str) -> float | None:
        """Check and mark the job in progress in one script (see the module docstring)."""
        if self._take is None:
            self._take = scripts(self.pool).take
        score = await self._take(
            keys=[in_progress_key_prefix + job_id, self.queue_name, OWNERS_TAKEN, run_key(job_id)],
            args=[job_id, timestamp_ms(), int(self.in_progress_timeout_s * 1000)],
        )
        return None if score is None else float(score)

    async def order(self, job_ids: list[bytes]) -> list[bytes]:
        """Round-robin across the runs' owners (worker/queue/fair.py)."""
        return await fair_order(self.pool, job_ids)

    async def after_poll(self) -> None:
        running = [t for t in self.tasks.values() if not t.done()]
        if self.job_counter >= self.max_jobs and running:
            # Full: the next look at the queue is due when a job ends.
            await asyncio.wait(running, timeout=self.idle_timeout, return_when=asyncio.FIRST_COMPLETED)
        elif self.allow_pick_jobs:
            try:
                await self.pool.blpop([WAKE_LIST], timeout=self.idle_timeout)  # type: ignore[misc, arg-type]  # float timeouts work on Redis >= 6
            except RedisError:
                await asyncio.sleep(self.idle_timeout)
        else:
            await asyncio.sleep(self.idle_timeout)
