"""Runs for operators: the ``runs`` table joined with what only Redis knows.

Three sources make one listing, newest first by (enqueued_at, id):

* runs still queued, read from arq's queue itself (what is listed is what will run),
  with their position and how long they have waited;
* runs cancelled while queued, whose only record is their Redis description
  (they never reached the worker, so they have no row; see api/runs/cancel.py), read as
  every run's recorded ending is read (shared/redis/ended.py);
* the ``runs`` table (running and finished runs), with the progress the worker
  reports for running ones: current node, step, elapsed time.

The cursor is the (enqueued_at, id) of the last run of a page. A run keeps its
key from enqueue to outcome, so a run that starts or finishes between two pages
is neither skipped nor listed twice, and new runs only ever appear before the
first page.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from dataclasses import dataclass

import structlog
from msgspec import UNSET, UnsetType
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from api.auth.scope import only_owner, visible
from api.http.ids import parse_id
from api.http.timefmt import iso_from_timestamp, millis_between, parse_iso
from api.runs import live, queue
from api.runs.schemas import RunBreakdown, RunInfo, RunList, WorkerInfo
from api.runs.status import run_error, run_status
from api.store import RunRow, Store
from shared.contracts.jobs import JobKind
from shared.contracts.runs import RunStatus
from shared.errors import BadRequest, NotFound, QueueUnavailable
from shared.redis.liveness import Liveness, read_liveness
from shared.settings import Settings

log = structlog.get_logger(__name__)

REDIS_DOWN = (RedisConnectionError, RedisTimeoutError)

Key = tuple[str, str]


def _kind(value: str) -> JobKind:
    try:
        return JobKind(value)
    except ValueError:
        return JobKind.RUN


def _millis(seconds: float) -> int:
    return max(0, round(seconds * 1000))


def from_row(row: RunRow, progress: live.Progress | None = None, now: float | None = None) -> RunInfo:
    error = run_error(row.status, row.error_code, row.error_message)
    waited = millis_between(row.enqueued_at, row.started_at)
    info = RunInfo(
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
        owner=row.owner,
        started_by=row.started_by or row.owner,
        cancelled_by=row.cancelled_by or UNSET,
    )
    if row.breakdown is not None:
        info.breakdown = RunBreakdown(
            queued_ms=waited if waited is not None else UNSET, model_ms=row.breakdown.model_ms,
            tools_ms=row.breakdown.tools_ms, database_ms=row.breakdown.database_ms,
        )
    if row.status == RunStatus.RUNNING:
        started = parse_iso(row.started_at)
        if started is not None:
            info.elapsed_ms = _millis((now or time.time()) - started.timestamp())
        if progress is not None:
            info.step_count = progress.step
            if progress.node:
                info.node = progress.node
            if progress.cancel_requested:
                info.cancel_requested = True
    return info


def _iso(timestamp: float | None) -> str | None:
    return iso_from_timestamp(timestamp) if timestamp else None


def _not_started(
    run: live.QueuedRun,
    status: RunStatus,
    *,
    position: int | UnsetType = UNSET,
    waited_ms: int | UnsetType = UNSET,
) -> RunInfo:
    """A run known only from its Redis description: the worker never started it, so it has
    no row, no start, no duration and no steps."""
    return RunInfo(
        id=run.id,
        conversation=run.conversation_id,
        kind=_kind(run.kind),
        status=status,
        enqueued_at=_iso(run.enqueued_at),
        started_at=None,
        finished_at=None,
        duration_ms=None,
        step_count=0,
        position=position,
        waited_ms=waited_ms,
        owner=run.owner,
        started_by=run.started_by or run.owner,
    )


def from_queued(run: live.QueuedRun, position: int, now: float | None = None) -> RunInfo:
    return _not_started(
        run,
        RunStatus.QUEUED,
        position=position,
        # A delayed run has waited for a worker only since it was due.
        waited_ms=_millis(max(0.0, (now or time.time()) - max(run.enqueued_at, run.due_at or 0.0)))
        if run.enqueued_at else 0,
    )


def from_ended(row: RunRow) -> RunInfo:
    """A run that ended without a row, as its record in Redis says (shared/redis/ended.py):
    cancelled while queued, dropped before it started, or refused when the worker took it.
    It never started: no start, no duration, no steps; it waited until it ended."""
    finished_at = row.finished_at or row.enqueued_at
    error = run_error(row.status, row.error_code, row.error_message)
    waited = millis_between(row.enqueued_at, finished_at)
    return RunInfo(
        id=row.id,
        conversation=row.conversation_id,
        kind=_kind(row.kind),
        status=run_status(row.status),
        enqueued_at=row.enqueued_at,
        started_at=None,
        finished_at=finished_at,
        duration_ms=None,
        step_count=0,
        waited_ms=waited if waited is not None else UNSET,
        error=error if error is not None else UNSET,
        owner=row.owner or UNSET,
        started_by=row.started_by or row.owner or UNSET,
        cancelled_by=row.cancelled_by or UNSET,
    )


def _before_ms(before: Key | None) -> float | None:
    """The newest enqueue time (ms) a page starting after ``before`` may hold: inclusive of the
    whole millisecond (the key's own run is left out by its id)."""
    if before is not None and (at := parse_iso(before[0])) is not None:
        return at.timestamp() * 1000 + 1
    return None


def sort_key(run: RunInfo) -> Key:
    return (run.enqueued_at or run.started_at or "", run.id)


#: Longer than any cursor this API gives out (a timestamp and a UUID, base64): refused
#: before it is decoded, so no cursor can make the decoder work hard.
CURSOR_MAX_CHARS = 200


def encode_cursor(key: Key) -> str:
    """The cursor of a listing (runs, conversations): a page's last (timestamp, id), opaque."""
    return base64.urlsafe_b64encode(json.dumps(list(key)).encode()).decode().rstrip("=")


def decode_cursor(raw: str) -> Key:
    """The (timestamp, id) of :func:`encode_cursor`, or BadRequest naming ``cursor``."""
    refused = BadRequest("cursor is not one this API gave out (pass nextCursor as it was)")
    if len(raw) > CURSOR_MAX_CHARS:
        raise refused
    try:
        at, run_id = json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
        if not isinstance(at, str) or parse_iso(at) is None:
            raise ValueError(at)
        return at, parse_id(run_id, "cursor")
    except (ValueError, TypeError, RecursionError, binascii.Error, BadRequest):
        # RecursionError: deeply nested JSON (refused by length now, kept as a second line).
        raise refused from None


def worker_info(liveness: Liveness, now: float | None = None) -> WorkerInfo:
    beat = liveness.beat
    if beat is None:
        return WorkerInfo(alive=liveness.alive, count=liveness.count)
    return WorkerInfo(
        alive=liveness.alive,
        count=liveness.count,
        pid=beat.pid if beat.pid is not None else UNSET,
        started_at=iso_from_timestamp(beat.started_at),
        last_beat_at=iso_from_timestamp(beat.beat_at),
        heartbeat_age_ms=_millis(liveness.age(now) or 0.0),
        concurrency=beat.concurrency if beat.concurrency is not None else UNSET,
    )


@dataclass(frozen=True, slots=True)
class Runs:
    store: Store
    redis: Redis
    settings: Settings

    async def queued(self, *, conversation_id: str | None, before: Key | None, want: int) -> list[RunInfo]:
        """The newest ``want`` runs queued and not started that the caller may see, older than
        ``before``, newest first: a window of arq's queue, never all of it (api/runs/queue.py).

        ``position`` counts from 0 the runs waiting ahead, every user's (the worker takes them in
        this order; a rename or a delete queued among them is not a run).
        """
        before_ms = _before_ms(before)
        owner = only_owner()
        found: list[live.QueuedRun] = []
        started: set[str] = set()
        ranks: dict[str, int] = {}
        if conversation_id is not None or owner is not None:
            # One conversation's runs, or one user's: where they are kept, not a page of everyone's.
            ids = await (
                queue.of_conversation(self.redis, conversation_id) if conversation_id is not None
                else queue.of_owner(self.redis, owner or "")
            )
            listed = await queue.entries(self.redis, ids)
            entries = [e for e in listed if before_ms is None or e.enqueued_ms <= before_ms]
            found, started = await self._waiting(entries, conversation_id, before)
        else:
            batch, offset = max(want, 50), 0
            while len(found) < want:
                entries = await queue.window(self.redis, before_ms=before_ms, offset=offset, count=batch)
                ranks.update((e.run_id, e.rank) for e in entries if e.rank is not None)
                offset += len(entries)
                more, recorded = await self._waiting(entries, None, before)
                found += more
                started |= recorded
                if len(entries) < batch:
                    break
        found = found[:want]
        if not found:
            return []
        started.update(await self.store.running_ids())
        places = await queue.positions(self.redis, [run.id for run in found], started, ranks)
        now = time.time()
        return [from_queued(run, places.get(run.id, 0), now) for run in found]

    async def _waiting(
        self, entries: list[queue.QueueEntry], conversation_id: str | None, before: Key | None
    ) -> tuple[list[live.QueuedRun], set[str]]:
        """Of these queue entries (newest first), the runs not started that the caller may see,
        in order; and the runs among them that started (they have a row)."""
        runs = [e.run_id for e in entries if queue.is_run(e.run_id)]
        started = await self.store.recorded_ids(runs) if runs else set()
        waiting = [run_id for run_id in runs if run_id not in started]
        described = await live.described_runs(self.redis, waiting)
        found = []
        for run_id in waiting:
            run = described.get(run_id)
            if run is None or not visible(run.owner):
                continue
            if conversation_id is not None and run.conversation_id != conversation_id:
                continue
            if before is not None and (_iso(run.enqueued_at) or "", run.id) >= before:
                continue
            found.append(run)
        return found, started

    async def worker(self) -> WorkerInfo | None:
        try:
            return worker_info(await read_liveness(self.redis))
        except REDIS_DOWN as exc:
            log.warning("runs.redis_unavailable", error=str(exc))
            return None

    async def with_progress(self, rows: list[RunRow]) -> list[RunInfo]:
        running = [r.id for r in rows if r.status == RunStatus.RUNNING]
        try:
            reports = await live.progress(self.redis, running)
        except REDIS_DOWN as exc:
            log.warning("runs.redis_unavailable", error=str(exc))
            reports = {}
        now = time.time()
        return [from_row(r, reports.get(r.id), now) for r in rows]

    async def _from_redis(
        self, status: RunStatus | None, conversation_id: str | None, before: Key | None, want: int
    ) -> list[RunInfo]:
        runs: list[RunInfo] = []
        if status in (None, RunStatus.QUEUED):
            runs += await self.queued(conversation_id=conversation_id, before=before, want=want)
        if status in (None, RunStatus.CANCELLED):
            cancelled = await live.cancelled_runs(
                self.redis, before_ms=_before_ms(before), conversation_id=conversation_id, limit=want
            )
            runs += [from_ended(r) for r in cancelled]
        return runs

    async def page(
        self, *, status: RunStatus | None, conversation_id: str | None, limit: int, cursor: str | None
    ) -> RunList:
        """One page of runs, newest first, and the cursor of the next one."""
        before = decode_cursor(cursor) if cursor else None
        want = limit + 1
        runs: list[RunInfo] = []
        try:
            runs += await self._from_redis(status, conversation_id, before, want)
        except REDIS_DOWN as exc:
            log.warning("runs.redis_unavailable", error=str(exc))
            if status in (RunStatus.QUEUED, RunStatus.CANCELLED):
                raise QueueUnavailable("the queue is unavailable, try again shortly") from exc
            # the rest is still worth showing
        if status not in (RunStatus.QUEUED,):
            rows = await self.store.runs(
                status=status.value if status else None, conversation_id=conversation_id,
                limit=want, before=before,
            )
            runs += await self.with_progress(rows)
        # A run that started between the two reads is in both: its row wins.
        unique: dict[str, RunInfo] = {}
        for run in runs:
            if run.id not in unique or unique[run.id].status is RunStatus.QUEUED:
                unique[run.id] = run
        ordered = sorted(
            (r for r in unique.values() if before is None or sort_key(r) < before), key=sort_key, reverse=True
        )
        page = ordered[:limit]
        worker = await self.worker()
        return RunList(
            runs=page,
            next_cursor=encode_cursor(sort_key(page[-1])) if len(ordered) > limit else UNSET,
            worker=worker if worker is not None else UNSET,
        )

    async def get(self, run_id: str) -> RunInfo:
        try:
            found = await live.recorded_run(self.redis, run_id, self.store.run)  # Redis without a row
            if found is None:
                raise NotFound(f"run {run_id} not found")
            if found.stored:
                return (await self.with_progress([found.row]))[0]
            if found.ended:
                return from_ended(found.row)
            described = (await live.described_runs(self.redis, [run_id])).get(run_id)
            if described is not None and visible(described.owner):
                places = await queue.positions(self.redis, [run_id], await self.store.running_ids())
                if run_id in places:
                    return from_queued(described, places[run_id])
        except REDIS_DOWN as exc:
            log.warning("runs.redis_unavailable", error=str(exc))
            raise QueueUnavailable("the queue is unavailable, try again shortly") from exc
        if described is None:
            raise NotFound(f"run {run_id} not found")
        # Out of the queue, not recorded yet: a worker has taken it and is starting it (or died
        # doing so, and the sweep will say). Still the first in line, not unknown.
        return from_queued(described, 0)
