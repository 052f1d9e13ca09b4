"""What Redis knows and SQLite does not (yet): queued runs, claimed conversations, the worker.

A run is *queued* while it is in arq's queue and has no row in ``runs`` (the
worker writes the row when it starts the run). Its ``run_key`` hash describes it.
A run cancelled while queued never gets a row: its ``run_key`` hash, marked
``status=cancelled``, is its record (read by shared/redis/ended.py, the one reader of a
recorded ending), listed through ``CANCELLED_RUNS``. While a run is running,
``progress_key`` holds its current step and node.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import Redis

from api.auth.scope import sees_everything, visible
from shared.contracts.jobs import is_delete_claim
from shared.contracts.runs import RunStatus
from shared.redis.ended import ReadRow, Recorded, from_description, recorded
from shared.redis.keys import (
    ACTIVE_RUNS,
    CANCELLED_RUNS,
    cancel_key,
    cancelled_run_key,
    progress_key,
    run_key,
)
from shared.storage.rows import RunRow


@dataclass(frozen=True, slots=True)
class QueuedRun:
    id: str
    conversation_id: str
    kind: str
    title: str
    enqueued_at: float
    new_conversation: bool
    #: whose run it is, and who asked for it
    owner: str = "local"
    started_by: str | None = None
    #: when a delayed run (``after_seconds``) is due: it waits for its time, not for a worker
    due_at: float | None = None


@dataclass(frozen=True, slots=True)
class Progress:
    """A running run as the worker last reported it."""

    node: str | None
    step: int
    started_at: float | None
    cancel_requested: bool


def _queued_run(run_id: str, fields: dict[str, str]) -> QueuedRun | None:
    if not fields.get("conversation"):
        return None
    try:
        enqueued_at = float(fields.get("enqueued_at") or 0.0)
    except ValueError:
        enqueued_at = 0.0
    return QueuedRun(
        id=run_id,
        conversation_id=fields["conversation"],
        kind=fields.get("kind") or "run",
        title=fields.get("title") or "",
        enqueued_at=enqueued_at,
        new_conversation=fields.get("new_conversation") == "1",
        owner=fields.get("owner") or "local",
        started_by=fields.get("started_by") or None,
        due_at=float(fields["due_at"]) if fields.get("due_at") else None,
    )


async def recorded_run(redis: Redis, run_id: str, read_row: ReadRow) -> Recorded | None:
    """What is recorded of ``run_id`` (shared/redis/ended.py), for the caller: another user's
    run is as unknown as one that never was (``read_row``, the store's, filters rows already)."""
    found = await recorded(redis, run_id, read_row)
    if found is None or found.stored or visible(found.row.owner):
        return found
    return None


def _float(raw: str | None) -> float | None:
    try:
        return float(raw) if raw else None
    except ValueError:
        return None


async def active_run(redis: Redis, conversation_id: str) -> str | None:
    """The run holding ``conversation_id`` (queued or running), if any (a delete is not a run),
    and if the caller may see it: another user's is as absent as none."""
    holder: str | None = await redis.hget(ACTIVE_RUNS, conversation_id)  # type: ignore[misc]
    if holder is None or is_delete_claim(holder):
        return None
    return holder if await holder_visible(redis, holder) else None


async def holder_visible(redis: Redis, run_id: str) -> bool:
    """May the caller see the queued or running run ``run_id`` (a conversation's holder)?"""
    if sees_everything():
        return True  # an operator: no need to ask
    described = (await described_runs(redis, [run_id])).get(run_id)
    return described is not None and visible(described.owner)


async def active_runs(redis: Redis) -> dict[str, str]:
    """conversation id -> run id, for every conversation with a queued or running run."""
    claims: dict[str, str] = await redis.hgetall(ACTIVE_RUNS)  # type: ignore[misc]
    return {conv: holder for conv, holder in claims.items() if not is_delete_claim(holder)}


async def described_runs(redis: Redis, run_ids: list[str]) -> dict[str, QueuedRun]:
    """The ``run_key`` descriptions of these runs (kept for a day after enqueue)."""
    found = {}
    for run_id, fields in zip(run_ids, await _descriptions(redis, run_ids), strict=True):
        if fields and (run := _queued_run(run_id, fields)) is not None:
            found[run_id] = run
    return found


async def _descriptions(redis: Redis, run_ids: list[str]) -> list[dict[str, str]]:
    """The ``run_key`` hashes of these runs, in one round trip."""
    if not run_ids:
        return []
    async with redis.pipeline(transaction=False) as pipe:
        for run_id in run_ids:
            pipe.hgetall(run_key(run_id))
        replies: list[dict[str, str]] = await pipe.execute()
    return replies


async def cancelled_while_queued(redis: Redis, conversation_id: str) -> RunRow | None:
    """The conversation's last run cancelled while queued, while its record is kept."""
    run_id: str | None = await redis.get(cancelled_run_key(conversation_id))
    if run_id is None:
        return None
    run = from_description(run_id, await redis.hgetall(run_key(run_id)))  # type: ignore[misc]
    if run is None or run.status != RunStatus.CANCELLED or run.conversation_id != conversation_id:
        return None
    return run if visible(run.owner) else None


async def progress(redis: Redis, run_ids: list[str]) -> dict[str, Progress]:
    """What the worker reports of these running runs (a run it has not reported yet is left out)."""
    if not run_ids:
        return {}
    async with redis.pipeline(transaction=False) as pipe:
        for run_id in run_ids:
            pipe.hgetall(progress_key(run_id))
            pipe.exists(cancel_key(run_id))
        replies = await pipe.execute()
    found = {}
    for i, run_id in enumerate(run_ids):
        fields, cancel = replies[2 * i], replies[2 * i + 1]
        if fields or cancel:
            try:
                step = int(fields.get("step") or 0)
            except ValueError:
                step = 0
            found[run_id] = Progress(
                node=fields.get("node") or None, step=step,
                started_at=_float(fields.get("started_at")), cancel_requested=bool(cancel),
            )
    return found


async def cancelled_runs(
    redis: Redis, *, before_ms: float | None, conversation_id: str | None, limit: int
) -> list[RunRow]:
    """Runs cancelled while queued, as their records say (rows they never had), newest enqueued
    first, from ``before_ms`` (inclusive) down.

    Entries whose record has expired are dropped from the index on the way.
    """
    found: list[RunRow] = []
    high: str = "+inf" if before_ms is None else repr(before_ms)
    batch = max(limit, 50)
    offset = 0
    while len(found) < limit:
        ids: list[str] = await redis.zrevrangebyscore(CANCELLED_RUNS, high, "-inf", start=offset, num=batch)
        if not ids:
            break
        offset += len(ids)
        described = {
            run_id: run for run_id, fields in zip(ids, await _descriptions(redis, ids), strict=True)
            if fields and (run := from_description(run_id, fields)) is not None
        }
        expired = [run_id for run_id in ids if run_id not in described]
        if expired:
            await redis.zrem(CANCELLED_RUNS, *expired)
            offset -= len(expired)
        for run_id in ids:
            run = described.get(run_id)
            if run is None or not visible(run.owner):
                continue
            if conversation_id is None or run.conversation_id == conversation_id:
                found.append(run)
        if len(ids) < batch:
            break
    return found
