"""Firing one cron's tick, exactly once across workers: claimed (committed), submitted to Redis,
recorded (the package's docstring tells the three steps and what a crash between them leaves)."""

from __future__ import annotations

import contextlib
import json
import time

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

from shared.contracts.crons import (
    FIRES,
    CronRow,
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
from shared.redis.threads import DELETE_AFTER_RUN_MINUTES, thread_with_ttl
from shared.storage import Database
from shared.storage.rows import title_of
from shared.storage.schema import iso_from_timestamp, now_iso

log = structlog.get_logger(__name__)

#: ``last_outcome`` of a tick claimed (moved on, committed) and not yet submitted
SUBMITTING = "submitting"
#: How long a claimed tick may stay unsubmitted before another pass submits it: its worker died
#: between the claim and the record, or stalled on Redis that long (then both submit the same run).
UNSUBMITTED_SECONDS = 30.0


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class _Skip(Exception):
    """The tick does not run: why."""


async def fire(db: Database, redis: Redis, cron: CronRow, now: float) -> bool:
    """Fire the cron's tick ``cron.next_tick`` unless another worker did; True if this one did."""
    tick = cron.next_tick
    following = cron.following(now)
    run_id = tick_run_id(cron.id, tick)
    # The tick is this worker's once this commits: no Redis round trip inside a transaction
    # (a Redis that stalls would hold the database's write lock, and every run's writes with it).
    async with db.transaction() as tx:
        moved = await tx.execute(
            "UPDATE crons SET next_tick = ?, last_tick = ?, last_outcome = ?, last_run_id = ?,"
            f" updated_at = ? WHERE id = ? AND next_tick = ? AND {FIRES}"
            " AND (last_outcome IS NULL OR last_outcome <> ?)",
            (following, tick, SUBMITTING, run_id, now_iso(), cron.id, tick, SUBMITTING),
        )
    if moved == 0:
        # Another worker fired it, or the cron was deleted or disabled, or its tick before is still being
        # submitted (one tick of a cron at a time: this one is fired once that one is recorded).
        return False
    try:
        return await _submit_and_record(db, redis, cron, tick, run_id, now, following)
    except Exception:
        # Redis down (or the record refused): the tick is due again, as it was, for the next
        # pass (its run, if it was submitted, is the same run then). Should this fail too, the
        # tick stays claimed, and is submitted again UNSUBMITTED_SECONDS later.
        async with db.transaction() as tx:
            await tx.execute(
                "UPDATE crons SET next_tick = ?, last_tick = ?, last_outcome = ?, last_run_id = ?"
                " WHERE id = ? AND last_outcome = ? AND last_tick = ?",
                (tick, cron.last_tick, cron.last_outcome, cron.last_run_id, cron.id, SUBMITTING, tick),
            )
        raise


async def submit_again(db: Database, redis: Redis, cron: CronRow, now: float) -> bool:
    """Submit the tick a worker claimed and did not submit (it died, or its database failed
    after Redis did): the same run, so a submission that did go through is no second run."""
    tick = cron.last_tick
    if tick is None:
        return False
    async with db.transaction() as tx:  # one worker takes it over
        taken = await tx.execute(
            "UPDATE crons SET updated_at = ? WHERE id = ? AND last_outcome = ? AND last_tick = ?"
            " AND updated_at = ?",
            (now_iso(), cron.id, SUBMITTING, tick, cron.updated_at),
        )
    if taken == 0:
        return False
    log.warning("cron.tick_submitted_again", tick=iso(tick))
    return await _submit_and_record(db, redis, cron, tick, tick_run_id(cron.id, tick), now, cron.next_tick)


async def _submit_and_record(
    db: Database, redis: Redis, cron: CronRow, tick: int, run_id: str, now: float, following: int
) -> bool:
    """Submit the claimed tick's run (after the claim's commit), then record what the tick did."""
    outcome = "fired"
    thread_id: str | None
    try:
        thread_id = await _submit(db, redis, cron, tick, run_id)
    except _Skip as why:
        outcome, thread_id = f"skipped: {why}", cron.thread_id
    column = "fired" if outcome == "fired" else "skipped"
    async with db.transaction() as tx:
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
        await redis.hincrby(METRICS_KEY, counter_field(CRON_TICKS, outcome=column), 1)  # type: ignore[misc]
    return True


async def _submit(db: Database, redis: Redis, cron: CronRow, tick: int, run_id: str) -> str:
    """Submit the tick's run; its thread. _Skip: the thread is busy."""
    thread_id = cron.thread_id or tick_thread_id(cron.id, tick)
    head: str | None = None
    new = True
    title = title_of(cron.message)
    if cron.thread_id is not None:
        # As a message on POST /api/chat is checked (api/chat/accept.py): the claim first, then the
        # row. A run records its outcome before it frees the claim, so a row read after a
        # free claim is that run's outcome, and a run ending ``waiting`` in between is seen.
        holder = await redis.hget(ACTIVE_RUNS, thread_id)  # type: ignore[misc]
        if holder is not None and _text(holder) != run_id:
            raise _Skip(f"the thread is busy with run {_text(holder)}")
        rows = await db.fetchall(
            "SELECT r.status, c.branch_head, c.title FROM conversations c"
            " LEFT JOIN runs r ON r.id = c.last_run_id WHERE c.id = ?",
            (thread_id,),
        )
        if rows:
            status, head, title = rows[0][0], rows[0][1], str(rows[0][2])
            new = False
            if status == RunStatus.WAITING and holder is None:
                raise _Skip("the thread waits for a decision")
        elif holder is None and not await redis.exists(protocol_thread_key(thread_id)):
            raise _Skip("the thread is gone")
    metadata = {**json.loads(cron.metadata), "cron_id": cron.id, "cron_tick": iso(tick)}
    key = protocol_run_key(run_id)
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hset(key, mapping={
            "metadata": json.dumps(metadata), "stream_mode": json.dumps(["values"]),
            "multitask_strategy": "reject",
        })
        pipe.expire(key, PROTOCOL_RUN_RETENTION_SECONDS)
        if cron.thread_id is None and cron.delete_threads:
            # ``on_run_completed: delete``: the tick's thread expires once its run has ended,
            # deleted by the sweep as any expired thread (worker/upkeep/expiry.py).
            at = time.time()
            thread_with_ttl(
                pipe, thread_id, cron.owner, DELETE_AFTER_RUN_MINUTES, iso_from_timestamp(at), at
            )
        await pipe.execute()
    job = RunJob(
        run_id=run_id, conversation_id=thread_id, kind=JobKind.RUN, message=cron.message,
        enqueued_at=time.time(), new_conversation=new, checkpoint_id=head, owner=cron.owner,
    )
    taken_by = await submit_run(redis, job, title=title)
    # Held by this very run: an earlier attempt at this tick submitted it and did not record it.
    if taken_by is not None and taken_by != run_id:
        await redis.delete(key)
        raise _Skip(f"the thread is busy with run {taken_by}")
    return thread_id
