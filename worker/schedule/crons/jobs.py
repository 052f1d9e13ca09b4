"""The cron jobs the API enqueues: store a cron, change it, delete it; each reports its outcome to
the request waiting on it, and a cron stored or changed wakes every worker's ticker (the package's
docstring tells why by pub/sub)."""

from __future__ import annotations

import contextlib
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
    cron_done_key,
    iso,
)
from shared.redis.outcomes import STOPPED, failure, report
from shared.storage import Database
from worker.entry import entry_point

log = structlog.get_logger(__name__)

#: Published on by the ``cron_create`` job once the cron is stored: the tickers look again.
CRONS_CHANNEL = "sophos:crons"


async def _notify(redis: Redis, job_id: str, outcome: str) -> None:
    await report(redis, cron_done_key(job_id), outcome, event="cron.notify_failed")


async def create(db: Database, redis: Redis, job: CronCreate) -> str:
    """Store the cron, its first tick the schedule's first after its creation (persist, then
    notify). A cron already stored (a second delivery) is left as it is."""
    outcome = STOPPED
    try:
        cron = CronRow.created(job)
        async with db.transaction() as tx:
            await tx.execute(
                "INSERT INTO crons (id, thread_id, schedule, message, metadata, created_at, updated_at,"
                " next_tick, owner, enabled, end_time, delete_threads)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO NOTHING",
                (cron.id, cron.thread_id, cron.schedule, cron.message, cron.metadata, cron.created_at,
                 cron.updated_at, cron.next_tick, cron.owner, int(cron.enabled), cron.end_time,
                 int(cron.delete_threads)),
            )
        outcome = "done"
        log.info("cron.created", cron_id=job.cron_id, thread_id=job.thread_id, schedule=job.schedule,
                 next_tick=iso(cron.next_tick))
        # Before the API is answered: once it is, the cron's tickers are awake. Lost (Redis
        # down), the tickers find the cron within their longest sleep.
        with contextlib.suppress(RedisError):
            await redis.publish(CRONS_CHANNEL, job.cron_id)
    except Exception as exc:
        outcome = failure(exc)
        log.exception("cron.create_failed", cron_id=job.cron_id)
    finally:
        await _notify(redis, job.job_id, outcome)
    return outcome


async def update(db: Database, redis: Redis, job: CronUpdate) -> str:
    """Change the cron (a cron gone stays gone), as :meth:`CronRow.updated` says."""
    outcome = STOPPED
    try:
        async with db.transaction() as tx:
            rows = await tx.fetchall(f"SELECT {CRON_COLUMNS} FROM crons WHERE id = ?", (job.cron_id,))
            if rows:
                cron = CronRow.from_row(tuple(rows[0])).updated(job)
                await tx.execute(
                    "UPDATE crons SET schedule = ?, message = ?, metadata = ?, enabled = ?, next_tick = ?,"
                    " updated_at = ?, end_time = ?, delete_threads = ? WHERE id = ?",
                    (cron.schedule, cron.message, cron.metadata, int(cron.enabled), cron.next_tick,
                     cron.updated_at, cron.end_time, int(cron.delete_threads), job.cron_id),
                )
        outcome = "done"
        log.info("cron.updated", cron_id=job.cron_id, found=bool(rows), schedule=job.schedule,
                 enabled=job.enabled)
        with contextlib.suppress(RedisError):  # its next tick may be sooner: the tickers look again
            await redis.publish(CRONS_CHANNEL, job.cron_id)
    except Exception as exc:
        outcome = failure(exc)
        log.exception("cron.update_failed", cron_id=job.cron_id)
    finally:
        await _notify(redis, job.job_id, outcome)
    return outcome


async def delete(db: Database, redis: Redis, job: CronDelete) -> str:
    """Delete the cron: no tick of it fires after this commits."""
    outcome = STOPPED
    try:
        async with db.transaction() as tx:
            gone = await tx.execute("DELETE FROM crons WHERE id = ?", (job.cron_id,))
        outcome = "done"
        log.info("cron.deleted", cron_id=job.cron_id, found=gone > 0)
    except Exception as exc:
        outcome = failure(exc)
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
