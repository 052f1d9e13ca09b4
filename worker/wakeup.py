"""An arq worker that sleeps on Redis instead of polling it.

arq looks at its queue every ``poll_delay``: 0.5 s by default (~450 ms from
enqueue to start), and a 10 ms poll costs ~6 % of a core while idle. Here the
submit script pushes to ``WAKE_LIST`` and the idle worker waits on ``BLPOP``:
a job starts a Redis round trip after it is accepted, and an idle worker costs
nothing. The queue is still read on every wake-up and at least every
``idle_timeout``, so a missed wake-up delays a job, never loses it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from arq.worker import Worker
from redis.exceptions import RedisError

from shared.contracts import WAKE_LIST


class WakeableWorker(Worker):
    def __init__(self, *args: Any, idle_timeout: float = 1.0, **kwargs: Any) -> None:
        kwargs["poll_delay"] = 0  # the waiting happens in _poll_iteration
        super().__init__(*args, **kwargs)
        self.idle_timeout = idle_timeout

    async def _poll_iteration(self) -> None:
        await super()._poll_iteration()
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
