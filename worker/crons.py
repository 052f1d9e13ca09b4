"""Crons: storing and deleting them (jobs the API enqueues), and firing their ticks.

**Exactly once per tick, across any number of workers.** Every worker looks for due crons
every :data:`POLL_SECONDS`. A tick is fired in one transaction: a conditional update moves the
cron's ``next_tick`` on from the tick it read (``WHERE next_tick = <tick>``), which only one
worker's update can do (PostgreSQL locks the row: a second worker's update waits for the first
to commit, then matches nothing; SQLite has one writer); then the run is submitted, and what the
tick did is recorded; then the transaction commits. A failure before the commit (Redis down, a
crash) rolls the move back and the tick is fired again by the next pass, by whichever worker:
its run's id comes from the cron and the tick (shared/crons.py), so a second submission of a run
already accepted finds the thread held by that same run and counts as fired, and a run already
recorded is never executed twice (``RunService.execute``).

**The one-run rule.** A tick is submitted like any run (``shared.queue.submit``: the atomic
claim of the thread), checked as a message on ``POST /api/chat`` is. A thread held by another
run, or waiting for a decision (an approval), is not run on (one with a run to resume takes the
message, as it would from a user): the tick is recorded ``skipped`` (the cron's ``skipped``
count and last outcome, the log line ``cron.tick_skipped``, the counter
``sophos_cron_ticks_total{outcome="skipped"}``).

**Ticks missed while no worker ran** are fired once, late, by the first pass that finds them:
the tick fired is the first one missed, and the next is the schedule's first after now, so a
cron that missed many ticks fires once, not once per missed tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

from shared.contracts import (
    ACTIVE_RUNS,
    PROTOCOL_RUN_RETENTION_SECONDS,
    JobKind,
    RunJob,
    RunStatus,
    protocol_run_key,
    protocol_thread_key,
)
from shared.crons import (
    CRON_COLUMNS,
    CronCreate,
    CronDelete,
    CronRow,
    Schedule,
    cron_done_key,
    iso,
    tick_run_id,
    tick_thread_id,
)
from shared.metrics import CRON_TICKS, METRICS_KEY, counter_field
from shared.queue import submit_run
from shared.rows import title_of
from shared.schema import iso_from_timestamp, now_iso
from shared.storage import Database, Tx
from worker.runs import RunService

log = structlog.get_logger(__name__)

#: Seconds between two looks for due crons: how late a tick fires at most, a worker running.
POLL_SECONDS = 0.5
#: Due crons fired per look.
BATCH = 50
#: How long the outcome of a cron job is kept for the API request waiting on it.
OUTCOME_TTL_SECONDS = 60


# --- the jobs ---------------------------------------------------------------------


async def _notify(redis: Redis, job_id: str, outcome: str) -> None:
    key = cron_done_key(job_id)
    try:
        async with redis.pipeline(transaction=True) as pipe:
            pipe.rpush(key, outcome)
            pipe.expire(key, OUTCOME_TTL_SECONDS)
            await pipe.execute()
    except RedisError as exc:  # the API answered already, or will: the database is written
        log.warning("cron.notify_failed", error=str(exc))


async def create(db: Database, redis: Redis, job: CronCreate) -> str:
    """Store the cron, its first tick the schedule's first after its creation (persist, then
    notify). A cron already stored (a second delivery) is left as it is."""
    outcome = "failed: the worker stopped"
    try:
        first = Schedule.parse(job.schedule).next_after(job.created_at)
        created = iso_from_timestamp(job.created_at)
        async with db.transaction() as tx:
            await tx.execute(
                "INSERT INTO crons (id, thread_id, schedule, message, metadata, created_at, updated_at,"
                " next_tick) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO NOTHING",
                (job.cron_id, job.thread_id, job.schedule, job.message, json.dumps(job.metadata),
                 created, created, first),
            )
        outcome = "done"
        log.info("cron.created", cron_id=job.cron_id, thread_id=job.thread_id, schedule=job.schedule,
                 next_tick=iso(first))
    except Exception as exc:
        outcome = f"failed: {type(exc).__name__}: {exc}"
        log.exception("cron.create_failed", cron_id=job.cron_id)
    finally:
        await _notify(redis, job.job_id, outcome)
    return outcome


async def delete(db: Database, redis: Redis, job: CronDelete) -> str:
    """Delete the cron: no tick of it fires after this commits."""
    outcome = "failed: the worker stopped"
    try:
        async with db.transaction() as tx:
            gone = await tx.execute("DELETE FROM crons WHERE id = ?", (job.cron_id,))
        outcome = "done"
        log.info("cron.deleted", cron_id=job.cron_id, found=gone > 0)
    except Exception as exc:
        outcome = f"failed: {type(exc).__name__}: {exc}"
        log.exception("cron.delete_failed", cron_id=job.cron_id)
    finally:
        await _notify(redis, job.job_id, outcome)
    return outcome


async def cron_create_job(ctx: dict[str, Any], payload: dict[str, Any]) -> str:
    """arq's entry point: decode, bind log context, store."""
    job = CronCreate.from_dict(payload)
    with structlog.contextvars.bound_contextvars(job_id=job.job_id):
        service: RunService = ctx["service"]
        return await create(service.store.db, service.redis, job)


async def cron_delete_job(ctx: dict[str, Any], payload: dict[str, Any]) -> str:
    """arq's entry point: decode, bind log context, delete."""
    job = CronDelete.from_dict(payload)
    with structlog.contextvars.bound_contextvars(job_id=job.job_id):
        service: RunService = ctx["service"]
        return await delete(service.store.db, service.redis, job)


# --- the ticks --------------------------------------------------------------------


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class _Skip(Exception):
    """The tick does not run: why."""


class CronTicker:
    """Fires the due ticks of every cron, every ``interval`` seconds, in the background."""

    def __init__(self, db: Database, redis: Redis, *, interval: float = POLL_SECONDS) -> None:
        self.db = db
        self.redis = redis
        self.interval = interval
        self._task: asyncio.Task[None] | None = None

    async def once(self, now: float | None = None) -> int:
        """Fire the ticks due at ``now``; how many this worker fired or skipped."""
        now = time.time() if now is None else now
        rows = await self.db.fetchall(
            f"SELECT {CRON_COLUMNS} FROM crons WHERE next_tick <= ? ORDER BY next_tick LIMIT ?",
            (int(now), BATCH),
        )
        done = 0
        for row in rows:
            cron = CronRow.from_row(row)
            with structlog.contextvars.bound_contextvars(cron_id=cron.id):
                try:
                    done += await self.fire(cron, now)
                except Exception as exc:
                    # Rolled back: the tick is still due, and the next pass tries it again. One
                    # cron's failure does not hold back the others'.
                    error = f"{type(exc).__name__}: {exc}"
                    log.warning("cron.fire_failed", tick=iso(cron.next_tick), error=error)
        return done

    async def fire(self, cron: CronRow, now: float) -> bool:
        """Fire the cron's tick ``cron.next_tick`` unless another worker did; True if this one did."""
        tick = cron.next_tick
        following = Schedule.parse(cron.schedule).next_after(max(now, tick))
        outcome = "fired"
        run_id = tick_run_id(cron.id, tick)
        thread_id: str | None
        async with self.db.transaction() as tx:
            moved = await tx.execute(
                "UPDATE crons SET next_tick = ? WHERE id = ? AND next_tick = ?", (following, cron.id, tick)
            )
            if moved == 0:
                return False  # another worker fired it, or the cron was deleted
            try:
                thread_id = await self._submit(tx, cron, tick, run_id)
            except _Skip as why:
                outcome, thread_id = f"skipped: {why}", cron.thread_id
            column = "fired" if outcome == "fired" else "skipped"
            await tx.execute(
                f"UPDATE crons SET {column} = {column} + 1, last_tick = ?, last_outcome = ?,"
                " last_run_id = ?, updated_at = ? WHERE id = ?",
                (tick, outcome, run_id if outcome == "fired" else None, now_iso(), cron.id),
            )
        late = now - tick
        if outcome == "fired":
            log.info("cron.tick_fired", tick=iso(tick), run_id=run_id, thread_id=thread_id,
                     late_seconds=round(late, 3), next_tick=iso(following))
        else:
            log.warning("cron.tick_skipped", tick=iso(tick), thread_id=thread_id, reason=outcome,
                        next_tick=iso(following))
        with contextlib.suppress(RedisError):
            await self.redis.hincrby(METRICS_KEY, counter_field(CRON_TICKS, outcome=column), 1)  # type: ignore[misc]
        return True

    async def _submit(self, tx: Tx, cron: CronRow, tick: int, run_id: str) -> str:
        """Submit the tick's run (in the tick's transaction); its thread. _Skip: the thread is busy."""
        thread_id = cron.thread_id or tick_thread_id(cron.id, tick)
        head: str | None = None
        new = True
        title = title_of(cron.message)
        if cron.thread_id is not None:
            # As a message on POST /api/chat is checked (api/chat.py): the claim first, then the
            # row. A run records its outcome before it frees the claim, so a row read after a
            # free claim is that run's outcome, and a run ending ``waiting`` in between is seen.
            holder = await self.redis.hget(ACTIVE_RUNS, thread_id)  # type: ignore[misc]
            if holder is not None and _text(holder) != run_id:
                raise _Skip(f"the thread is busy with run {_text(holder)}")
            rows = await tx.fetchall(
                "SELECT r.status, c.branch_head, c.title FROM conversations c"
                " LEFT JOIN runs r ON r.id = c.last_run_id WHERE c.id = ?",
                (thread_id,),
            )
            if rows:
                status, head, title = rows[0][0], rows[0][1], str(rows[0][2])
                new = False
                if status == RunStatus.WAITING and holder is None:
                    raise _Skip("the thread waits for a decision")
            elif holder is None and not await self.redis.exists(protocol_thread_key(thread_id)):
                raise _Skip("the thread is gone")
        metadata = {**json.loads(cron.metadata), "cron_id": cron.id, "cron_tick": iso(tick)}
        key = protocol_run_key(run_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping={
                "metadata": json.dumps(metadata), "stream_mode": json.dumps(["values"]),
                "multitask_strategy": "reject",
            })
            pipe.expire(key, PROTOCOL_RUN_RETENTION_SECONDS)
            await pipe.execute()
        job = RunJob(
            run_id=run_id, conversation_id=thread_id, kind=JobKind.RUN, message=cron.message,
            enqueued_at=time.time(), new_conversation=new, checkpoint_id=head,
        )
        taken_by = await submit_run(self.redis, job, title=title)
        # Held by this very run: an earlier attempt at this tick submitted it and did not commit.
        if taken_by is not None and taken_by != run_id:
            await self.redis.delete(key)
            raise _Skip(f"the thread is busy with run {taken_by}")
        return thread_id

    async def _forever(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.once()
            except Exception as exc:
                # The database or Redis is down, or a bug: the next pass tries again.
                log.warning("cron.pass_failed", error=f"{type(exc).__name__}: {exc}")

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._forever(), name="cron-ticker")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
