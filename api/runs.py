"""Runs for operators: the ``runs`` table joined with the runs still queued in Redis."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import structlog
from msgspec import UNSET
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from api import live
from api.schemas import RunError, RunInfo
from api.store import RunRow, Store
from api.timefmt import iso_from_timestamp, millis_between
from shared.contracts import JobKind, RunErrorCode, RunStatus
from shared.errors import NotFound, QueueUnavailable

log = structlog.get_logger(__name__)

REDIS_DOWN = (RedisConnectionError, RedisTimeoutError)


def run_error(status: str, code: str | None, message: str | None) -> RunError | None:
    """The error shown for a run that failed or was interrupted."""
    if status not in (RunStatus.FAILED, RunStatus.INTERRUPTED) and not code:
        return None
    default = RunErrorCode.INTERRUPTED if status == RunStatus.INTERRUPTED else RunErrorCode.AGENT_FAILURE
    return RunError(code=code or default, message=message or f"the run {status}")


def _kind(value: str) -> JobKind:
    try:
        return JobKind(value)
    except ValueError:
        return JobKind.RUN


def from_row(row: RunRow) -> RunInfo:
    error = run_error(row.status, row.error_code, row.error_message)
    waited = millis_between(row.enqueued_at, row.started_at)
    return RunInfo(
        id=row.id,
        conversation=row.conversation_id,
        kind=_kind(row.kind),
        status=RunStatus(row.status),
        enqueued_at=row.enqueued_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        duration_ms=millis_between(row.started_at, row.finished_at),
        step_count=row.step_count,
        error=error if error is not None else UNSET,
        waited_ms=waited if waited is not None else UNSET,
    )


def from_queued(run: live.QueuedRun, position: int) -> RunInfo:
    now = datetime.now(UTC)
    enqueued = datetime.fromtimestamp(run.enqueued_at, UTC) if run.enqueued_at else None
    return RunInfo(
        id=run.id,
        conversation=run.conversation_id,
        kind=_kind(run.kind),
        status=RunStatus.QUEUED,
        enqueued_at=iso_from_timestamp(run.enqueued_at) if run.enqueued_at else None,
        started_at=None,
        finished_at=None,
        duration_ms=None,
        step_count=0,
        position=position,
        waited_ms=millis_between(enqueued, now) or 0,
    )


def _newest_first(run: RunInfo) -> str:
    return run.enqueued_at or run.started_at or ""


@dataclass(frozen=True, slots=True)
class Runs:
    store: Store
    redis: Redis

    async def queued(self) -> list[RunInfo]:
        """Runs in arq's queue that the worker has not started, in queue order.

        ``position`` counts from 0 among them; the worker takes them in this order.
        """
        entries = await live.queue(self.redis)
        started = await self.store.runs_by_id([e.run_id for e in entries])
        waiting = [e.run_id for e in entries if e.run_id not in started]
        described = await live.described_runs(self.redis, waiting)
        return [
            from_queued(described[run_id], position)
            for position, run_id in enumerate(waiting)
            if run_id in described
        ]

    async def newest_first(
        self, *, status: RunStatus | None, conversation_id: str | None, limit: int
    ) -> list[RunInfo]:
        runs: list[RunInfo] = []
        if status in (None, RunStatus.QUEUED):
            try:
                queued = await self.queued()
            except REDIS_DOWN as exc:
                log.warning("runs.redis_unavailable", error=str(exc))
                if status is RunStatus.QUEUED:
                    raise QueueUnavailable("the queue is unavailable, try again shortly") from exc
                queued = []  # the rest is still worth showing
            runs += [r for r in queued if conversation_id is None or r.conversation == conversation_id]
        if status is not RunStatus.QUEUED:
            rows = await self.store.runs(
                status=status.value if status else None, conversation_id=conversation_id, limit=limit
            )
            runs += [from_row(r) for r in rows]
        runs.sort(key=_newest_first, reverse=True)
        return runs[:limit]

    async def get(self, run_id: str) -> RunInfo:
        row = await self.store.run(run_id)
        if row is not None:
            return from_row(row)
        try:
            queued = await self.queued()
        except REDIS_DOWN as exc:
            log.warning("runs.redis_unavailable", error=str(exc))
            raise QueueUnavailable("the queue is unavailable, try again shortly") from exc
        for run in queued:
            if run.id == run_id:
                return run
        raise NotFound(f"run {run_id} not found")
