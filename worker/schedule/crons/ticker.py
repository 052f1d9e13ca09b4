"""When a ticker looks for due crons: after each pass it sleeps until the earliest next tick of all
crons, within bounds, and a cron stored wakes it (the package's docstring tells why)."""

from __future__ import annotations

import asyncio
import contextlib
import time

import structlog
from redis.asyncio import Redis

from shared.contracts.crons import (
    CRON_COLUMNS,
    FIRES,
    CronRow,
    iso,
)
from shared.storage import Database
from shared.storage.schema import iso_from_timestamp
from worker.schedule.crons import ticks
from worker.schedule.crons.jobs import CRONS_CHANNEL
from worker.schedule.crons.ticks import SUBMITTING, UNSUBMITTED_SECONDS
from worker.subscription import listen

log = structlog.get_logger(__name__)

#: The longest a ticker sleeps: how late it finds a cron whose publication it missed.
LONGEST_SLEEP_SECONDS = 60.0
#: How soon a pass follows one that left a tick due (failed, or beyond the batch).
RETRY_SECONDS = 0.5
#: A ticker wakes this long after a tick: woken a hair early, a pass would find it not yet due.
_PAST_THE_TICK = 0.005
#: Due crons fired per look.
BATCH = 50


def pause(earliest: int | None, now: float) -> float:
    """How long a ticker sleeps after a pass at ``now``: until ``earliest``, the earliest next
    tick of all crons (None: there is no cron), within the bounds the module's docstring gives."""
    if earliest is None:
        return LONGEST_SLEEP_SECONDS
    if earliest <= now:
        return RETRY_SECONDS
    return min(earliest - now + _PAST_THE_TICK, LONGEST_SLEEP_SECONDS)


class CronTicker:
    """Fires the due ticks of every cron in the background, waking at the next one."""

    def __init__(self, db: Database, redis: Redis) -> None:
        self.db = db
        self.redis = redis
        self._tasks: list[asyncio.Task[None]] = []
        #: passes made so far, each followed by a sleep
        self.passes = 0
        #: set by a cron stored (a publication on CRONS_CHANNEL) and by each subscription
        self._wake = asyncio.Event()

    async def once(self, now: float | None = None) -> int:
        """Fire the ticks due at ``now``, and those a worker claimed and never submitted; how many
        this worker fired or skipped."""
        now = time.time() if now is None else now
        rows = await self.db.fetchall(
            f"SELECT {CRON_COLUMNS} FROM crons WHERE next_tick <= ? AND {FIRES}"
            " ORDER BY next_tick LIMIT ?",
            (int(now), BATCH),
        )
        unsubmitted = await self.db.fetchall(
            f"SELECT {CRON_COLUMNS} FROM crons WHERE last_outcome = ? AND updated_at < ? LIMIT ?",
            (SUBMITTING, iso_from_timestamp(now - UNSUBMITTED_SECONDS), BATCH),
        )
        # A cron's unsubmitted tick goes first; its tick due now, at the next pass.
        claimed = {row[0] for row in unsubmitted}
        work = [*((r, True) for r in unsubmitted), *((r, False) for r in rows if r[0] not in claimed)]
        done = 0
        for row, again in work:
            cron = CronRow.from_row(row)
            with structlog.contextvars.bound_contextvars(cron_id=cron.id):
                try:
                    tick = ticks.submit_again if again else ticks.fire
                    done += await tick(self.db, self.redis, cron, now)
                except Exception as exc:
                    # The tick is still due (or still to submit), and a later pass tries it again.
                    # One cron's failure does not hold back the others'.
                    error = f"{type(exc).__name__}: {exc}"
                    log.warning("cron.fire_failed", tick=iso(cron.next_tick), error=error)
        return done

    async def earliest(self) -> int | None:
        """The earliest next tick of all enabled crons; None if there is none."""
        rows = await self.db.fetchall(f"SELECT MIN(next_tick) FROM crons WHERE {FIRES}")
        return None if not rows or rows[0][0] is None else int(rows[0][0])

    async def _forever(self) -> None:
        while True:
            # Cleared before the pass: a cron stored during it wakes the ticker for one more.
            self._wake.clear()
            sleep = RETRY_SECONDS
            try:
                await self.once()
                sleep = pause(await self.earliest(), time.time())
            except Exception as exc:
                # The database or Redis is down, or a bug: the next pass tries again.
                log.warning("cron.pass_failed", error=f"{type(exc).__name__}: {exc}")
            self.passes += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), sleep)

    async def _subscribed(self) -> None:
        self._wake.set()  # a cron may have been stored while the subscription was away

    def _stored(self, cron_id: str) -> None:
        self._wake.set()

    def start(self) -> None:
        if not self._tasks:
            self._tasks = [
                asyncio.create_task(self._forever(), name="cron-ticker"),
                asyncio.create_task(
                    listen(self.redis, CRONS_CHANNEL, subscribed=self._subscribed, heard=self._stored),
                    name="cron-wakes",
                ),
            ]

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
