"""Crons: storing and deleting them (jobs the API enqueues), and firing their ticks.

**Exactly once per tick, across any number of workers.** Every worker's ticker looks for due
crons (a pass). A tick is fired in three steps, and no Redis round trip happens inside a
transaction (a Redis that stalls would hold the database's write lock, and with it every run's
checkpoint and ledger writes):

1. *claimed*: a conditional update moves the cron's ``next_tick`` on from the tick it read
   (``WHERE next_tick = <tick>``) and marks the tick ``submitting``, which only one worker's update
   can do (PostgreSQL locks the row: a second worker's update waits for the first to commit, then
   matches nothing; SQLite has one writer); committed at once;
2. *submitted*: the run is submitted to Redis (or the tick found skipped);
3. *recorded*: what the tick did (``fired``, ``skipped``) replaces ``submitting``.

Redis failing at 2 puts the tick back as it was (due again: the next pass fires it). A worker
that dies between 1 and 3 leaves the tick ``submitting``; a pass submits it again once it has
been so for :data:`UNSUBMITTED_SECONDS`. Either way the run is the same: its id comes from the
cron and the tick (shared/contracts/crons.py), so a second submission of a run already accepted
finds the thread held by that same run and counts as fired, and a run already recorded is never
executed twice (``RunService.execute``). A cron has one tick in flight at a time: its next tick
fires once the one ``submitting`` is recorded.

**The one-run rule.** A tick is submitted like any run (``shared.redis.queue.submit``: the atomic
claim of the thread), checked as a message on ``POST /api/chat`` is. A thread held by another
run, or waiting for a decision (an approval), is not run on (one with a run to resume takes the
message, as it would from a user): the tick is recorded ``skipped`` (the cron's ``skipped``
count and last outcome, the log line ``cron.tick_skipped``, the counter
``sophos_cron_ticks_total{outcome="skipped"}``).

**Ticks missed while no worker ran** are fired once, late, by the first pass that finds them:
the tick fired is the first one missed, and the next is the schedule's first after now, so a
cron that missed many ticks fires once, not once per missed tick.

**When a ticker looks.** Not on a fixed beat, which queried the database twice a second per
worker, crons or none: after each pass it sleeps until the earliest next tick of all crons (:func:`pause`), at
most :data:`LONGEST_SLEEP_SECONDS`, and a cron stored wakes it at once. The ``cron_create`` job
publishes on :data:`CRONS_CHANNEL` after its commit, and every worker's ticker is subscribed
(worker/run/subscription.py). Pub/sub rather than only waking the ticker of the worker that ran the
job: every worker is then ready for the new cron's first tick, and if that one worker is killed
the next second, the tick still fires on time instead of up to the longest sleep late, and two
workers contend for every tick as for those of crons already stored. A subscription (the first,
and each one after a lost connection) starts a pass too, for a cron stored while it was away; the
bound on the sleep covers a publication lost otherwise (Redis down just after the commit). A
deleted cron wakes no one: a ticker asleep until its tick wakes to a pass that finds nothing. A
tick still due after a pass (its firing failed, or more than :data:`BATCH` were due) is tried
again :data:`RETRY_SECONDS` later.
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

from shared.contracts.crons import (
    CRON_COLUMNS,
    CronCreate,
    CronDelete,
    CronRow,
    CronUpdate,
    Schedule,
    cron_done_key,
    iso,
    tick_run_id,
    tick_thread_id,
)
from shared.contracts.jobs import JobKind, RunJob
from shared.contracts.runs import RunStatus
from shared.redis.keys import (
    ACTIVE_RUNS,
    PROTOCOL_RUN_RETENTION_SECONDS,
    protocol_run_key,
    protocol_thread_key,
)
from shared.redis.metrics import CRON_TICKS, METRICS_KEY, counter_field
from shared.redis.queue import submit_run
from shared.storage import Database
from shared.storage.rows import title_of
from shared.storage.schema import iso_from_timestamp, now_iso
from worker.entry import entry_point
from worker.run.subscription import listen

log = structlog.get_logger(__name__)

#: The longest a ticker sleeps: how late it finds a cron whose publication it missed.
LONGEST_SLEEP_SECONDS = 60.0
#: How soon a pass follows one that left a tick due (failed, or beyond the batch).
RETRY_SECONDS = 0.5
#: A ticker wakes this long after a tick: woken a hair early, a pass would find it not yet due.
_PAST_THE_TICK = 0.005
#: Published on by the ``cron_create`` job once the cron is stored: the tickers look again.
CRONS_CHANNEL = "sophos:crons"
#: Due crons fired per look.
BATCH = 50
#: How long the outcome of a cron job is kept for the API request waiting on it.
OUTCOME_TTL_SECONDS = 60
#: ``last_outcome`` of a tick claimed (moved on, committed) and not yet submitted
SUBMITTING = "submitting"
#: How long a claimed tick may stay unsubmitted before another pass submits it: its worker died
#: between the claim and the record, or stalled on Redis that long (then both submit the same run).
UNSUBMITTED_SECONDS = 30.0


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
                " next_tick, owner, enabled) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT(id) DO NOTHING",
                (job.cron_id, job.thread_id, job.schedule, job.message, json.dumps(job.metadata),
                 created, created, first, job.owner, int(job.enabled)),
            )
        outcome = "done"
        log.info("cron.created", cron_id=job.cron_id, thread_id=job.thread_id, schedule=job.schedule,
                 next_tick=iso(first))
        # Before the API is answered: once it is, the cron's tickers are awake. Lost (Redis
        # down), the tickers find the cron within their longest sleep.
        with contextlib.suppress(RedisError):
            await redis.publish(CRONS_CHANNEL, job.cron_id)
    except Exception as exc:
        outcome = f"failed: {type(exc).__name__}: {exc}"
        log.exception("cron.create_failed", cron_id=job.cron_id)
    finally:
        await _notify(redis, job.job_id, outcome)
    return outcome


async def update(db: Database, redis: Redis, job: CronUpdate) -> str:
    """Change the cron (a cron gone stays gone). A new schedule, or the cron enabled, moves its
    next tick to the schedule's first after the update: no tick missed while disabled fires."""
    outcome = "failed: the worker stopped"
    try:
        async with db.transaction() as tx:
            rows = await tx.fetchall(f"SELECT {CRON_COLUMNS} FROM crons WHERE id = ?", (job.cron_id,))
            if rows:
                cron = CronRow.from_row(tuple(rows[0]))
                schedule = job.schedule if job.schedule is not None else cron.schedule
                enabled = cron.enabled if job.enabled is None else job.enabled
                restart = job.schedule is not None or (enabled and not cron.enabled)
                next_tick = Schedule.parse(schedule).next_after(job.updated_at) if restart else cron.next_tick
                metadata = cron.metadata if job.metadata is None else json.dumps(job.metadata)
                await tx.execute(
                    "UPDATE crons SET schedule = ?, message = ?, metadata = ?, enabled = ?, next_tick = ?,"
                    " updated_at = ? WHERE id = ?",
                    (schedule, job.message if job.message is not None else cron.message, metadata,
                     int(enabled), next_tick, iso_from_timestamp(job.updated_at), job.cron_id),
                )
        outcome = "done"
        log.info("cron.updated", cron_id=job.cron_id, found=bool(rows), schedule=job.schedule,
                 enabled=job.enabled)
        with contextlib.suppress(RedisError):  # its next tick may be sooner: the tickers look again
            await redis.publish(CRONS_CHANNEL, job.cron_id)
    except Exception as exc:
        outcome = f"failed: {type(exc).__name__}: {exc}"
        log.exception("cron.update_failed", cron_id=job.cron_id)
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


@entry_point(CronCreate)
async def cron_create_job(ctx: dict[str, Any], job: CronCreate) -> str:
    """arq's entry point: store."""
    return await create(ctx["store"].db, ctx["redis"], job)


@entry_point(CronUpdate)
async def cron_update_job(ctx: dict[str, Any], job: CronUpdate) -> str:
    """arq's entry point: update."""
    return await update(ctx["store"].db, ctx["redis"], job)


@entry_point(CronDelete)
async def cron_delete_job(ctx: dict[str, Any], job: CronDelete) -> str:
    """arq's entry point: delete."""
    return await delete(ctx["store"].db, ctx["redis"], job)


# --- the ticks --------------------------------------------------------------------


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class _Skip(Exception):
    """The tick does not run: why."""


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
            f"SELECT {CRON_COLUMNS} FROM crons WHERE next_tick <= ? AND enabled = 1"
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
                    done += await (self.submit_again(cron, now) if again else self.fire(cron, now))
                except Exception as exc:
                    # The tick is still due (or still to submit), and a later pass tries it again.
                    # One cron's failure does not hold back the others'.
                    error = f"{type(exc).__name__}: {exc}"
                    log.warning("cron.fire_failed", tick=iso(cron.next_tick), error=error)
        return done

    async def fire(self, cron: CronRow, now: float) -> bool:
        """Fire the cron's tick ``cron.next_tick`` unless another worker did; True if this one did."""
        tick = cron.next_tick
        following = Schedule.parse(cron.schedule).next_after(max(now, tick))
        run_id = tick_run_id(cron.id, tick)
        # The tick is this worker's once this commits: no Redis round trip inside a transaction
        # (a Redis that stalls would hold the database's write lock, and every run's writes with it).
        async with self.db.transaction() as tx:
            moved = await tx.execute(
                "UPDATE crons SET next_tick = ?, last_tick = ?, last_outcome = ?, last_run_id = ?,"
                " updated_at = ? WHERE id = ? AND next_tick = ? AND enabled = 1"
                " AND (last_outcome IS NULL OR last_outcome <> ?)",
                (following, tick, SUBMITTING, run_id, now_iso(), cron.id, tick, SUBMITTING),
            )
        if moved == 0:
            # Another worker fired it, or the cron was deleted or disabled, or its tick before is still being
            # submitted (one tick of a cron at a time: this one is fired once that one is recorded).
            return False
        try:
            return await self._submit_and_record(cron, tick, run_id, now, following)
        except Exception:
            # Redis down (or the record refused): the tick is due again, as it was, for the next
            # pass (its run, if it was submitted, is the same run then). Should this fail too, the
            # tick stays claimed, and is submitted again UNSUBMITTED_SECONDS later.
            async with self.db.transaction() as tx:
                await tx.execute(
                    "UPDATE crons SET next_tick = ?, last_tick = ?, last_outcome = ?, last_run_id = ?"
                    " WHERE id = ? AND last_outcome = ? AND last_tick = ?",
                    (tick, cron.last_tick, cron.last_outcome, cron.last_run_id, cron.id, SUBMITTING, tick),
                )
            raise

    async def submit_again(self, cron: CronRow, now: float) -> bool:
        """Submit the tick a worker claimed and did not submit (it died, or its database failed
        after Redis did): the same run, so a submission that did go through is no second run."""
        tick = cron.last_tick
        if tick is None:
            return False
        async with self.db.transaction() as tx:  # one worker takes it over
            taken = await tx.execute(
                "UPDATE crons SET updated_at = ? WHERE id = ? AND last_outcome = ? AND last_tick = ?"
                " AND updated_at = ?",
                (now_iso(), cron.id, SUBMITTING, tick, cron.updated_at),
            )
        if taken == 0:
            return False
        log.warning("cron.tick_submitted_again", tick=iso(tick))
        return await self._submit_and_record(cron, tick, tick_run_id(cron.id, tick), now, cron.next_tick)

    async def _submit_and_record(
        self, cron: CronRow, tick: int, run_id: str, now: float, following: int
    ) -> bool:
        """Submit the claimed tick's run (after the claim's commit), then record what the tick did."""
        outcome = "fired"
        thread_id: str | None
        try:
            thread_id = await self._submit(cron, tick, run_id)
        except _Skip as why:
            outcome, thread_id = f"skipped: {why}", cron.thread_id
        column = "fired" if outcome == "fired" else "skipped"
        async with self.db.transaction() as tx:
            recorded = await tx.execute(
                f"UPDATE crons SET {column} = {column} + 1, last_outcome = ?, last_run_id = ?, updated_at = ?"
                " WHERE id = ? AND last_outcome = ? AND last_tick = ?",
                (outcome, run_id if outcome == "fired" else None, now_iso(), cron.id, SUBMITTING, tick),
            )
        if recorded == 0:
            return False  # a worker that took it over recorded it (this one stalled that long)
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

    async def _submit(self, cron: CronRow, tick: int, run_id: str) -> str:
        """Submit the tick's run; its thread. _Skip: the thread is busy."""
        thread_id = cron.thread_id or tick_thread_id(cron.id, tick)
        head: str | None = None
        new = True
        title = title_of(cron.message)
        if cron.thread_id is not None:
            # As a message on POST /api/chat is checked (api/chat/submit.py): the claim first, then the
            # row. A run records its outcome before it frees the claim, so a row read after a
            # free claim is that run's outcome, and a run ending ``waiting`` in between is seen.
            holder = await self.redis.hget(ACTIVE_RUNS, thread_id)  # type: ignore[misc]
            if holder is not None and _text(holder) != run_id:
                raise _Skip(f"the thread is busy with run {_text(holder)}")
            rows = await self.db.fetchall(
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
            enqueued_at=time.time(), new_conversation=new, checkpoint_id=head, owner=cron.owner,
        )
        taken_by = await submit_run(self.redis, job, title=title)
        # Held by this very run: an earlier attempt at this tick submitted it and did not record it.
        if taken_by is not None and taken_by != run_id:
            await self.redis.delete(key)
            raise _Skip(f"the thread is busy with run {taken_by}")
        return thread_id

    async def earliest(self) -> int | None:
        """The earliest next tick of all enabled crons; None if there is none."""
        rows = await self.db.fetchall("SELECT MIN(next_tick) FROM crons WHERE enabled = 1")
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
