"""Deleting a conversation: its thread, its rows, what Redis keeps of its runs.

The API claims the conversation with a delete claim and enqueues the job
(api/conversations/deletion.py); no run of it can be queued or running meanwhile. Order, and why:

1. The thread's checkpoints and writes (``saver.adelete_thread``, its own commit).
2. The conversation's row and its runs' rows, in one transaction.
3. Redis: the runs' event streams, descriptions, progress and cancel keys; a mark
   that the conversation is deleted, so an ``Idempotency-Key`` answer naming it is
   refused from now on (api/chat/idempotency.py), kept as long as such an answer.
4. Free the conversation and publish the outcome for the API waiting on it
   (persist, then notify).

A crash between two steps leaves a state the same job completes when arq delivers
it again (each step deletes what is there, so it is safe twice); until then the
conversation is still listed after step 1 (without messages), so the user sees
it and can delete it again: the thread's content is never left behind invisibly.
Whatever fails, the claim is released (the conversation is not blocked) and the
API is told, so the user may try again.
"""

from __future__ import annotations

from typing import Any

import structlog
from langgraph.checkpoint.base import BaseCheckpointSaver
from redis.asyncio import Redis
from redis.exceptions import RedisError

from shared.contracts.jobs import DeleteJob
from shared.redis.keys import (
    ACTIVE_RUNS,
    CANCELLED_RUNS,
    IDEMPOTENCY_TTL_SECONDS,
    cancel_key,
    cancelled_run_key,
    conversation_deleted_key,
    deleted_key,
    events_key,
    model_call_key,
    progress_key,
    protocol_run_key,
    protocol_thread_key,
    run_key,
)
from shared.redis.metrics import CONVERSATIONS_EXPIRED, METRICS_KEY, counter_field
from shared.redis.outcomes import STOPPED, failure, push
from shared.redis.scripts import scripts
from shared.redis.threads import forget_thread
from worker.entry import entry_point
from worker.store import RunStore

log = structlog.get_logger(__name__)

#: ``DeleteJob.reason`` of the deletes ``CONVERSATION_RETENTION_DAYS`` asks for (worker/upkeep/retention.py)
RETENTION = "retention"
#: ``DeleteJob.reason`` of the deletes of threads past their ``ttl``, or left empty past
#: ``EMPTY_THREAD_RETENTION_MINUTES`` (worker/upkeep/expiry.py)
EXPIRED = "expired"


async def delete_conversation_data(
    saver: BaseCheckpointSaver[Any], store: RunStore, redis: Redis, conversation_id: str,
) -> int:
    """Delete the conversation's thread, rows and run records; return how many runs it had."""
    await saver.adelete_thread(conversation_id)
    run_ids = await store.delete_conversation(conversation_id)
    await _forget_runs(redis, conversation_id, run_ids)
    return len(run_ids)


async def _cancelled_while_queued(redis: Redis, conversation_id: str) -> list[str]:
    """The conversation's runs cancelled while queued: no row names them, only their Redis record.

    Read from the index of such runs (kept 7 days, so bounded), a batch at a time.
    """
    found: list[str] = []
    batch: list[str] = []

    async def check() -> None:
        async with redis.pipeline(transaction=False) as pipe:
            for run_id in batch:
                pipe.hget(run_key(run_id), "conversation")
            owners = await pipe.execute()
        # The worker's client returns bytes (arq's pool does not decode).
        wanted = (conversation_id, conversation_id.encode())
        found.extend(run_id for run_id, owner in zip(batch, owners, strict=True) if owner in wanted)
        batch.clear()

    async for member, _ in redis.zscan_iter(CANCELLED_RUNS, count=500):
        batch.append(member.decode() if isinstance(member, bytes) else str(member))
        if len(batch) >= 500:
            await check()
    if batch:
        await check()
    return found


async def _forget_runs(redis: Redis, conversation_id: str, run_ids: list[str]) -> None:
    cancelled = await _cancelled_while_queued(redis, conversation_id)
    owner = await redis.hget(protocol_thread_key(conversation_id), "owner")  # type: ignore[misc]
    async with redis.pipeline(transaction=False) as pipe:
        for run_id in [*run_ids, *cancelled]:
            pipe.delete(events_key(run_id), run_key(run_id), progress_key(run_id), cancel_key(run_id))
        if cancelled:
            pipe.zrem(CANCELLED_RUNS, *cancelled)
        pipe.delete(cancelled_run_key(conversation_id), model_call_key(conversation_id))
        # Its thread, for the Agent Protocol (api/protocol/), goes with it.
        forget_thread(pipe, conversation_id, owner.decode() if isinstance(owner, bytes) else owner)
        if run_ids:
            pipe.delete(*(protocol_run_key(r) for r in run_ids))
        pipe.set(conversation_deleted_key(conversation_id), 1, ex=IDEMPOTENCY_TTL_SECONDS)
        await pipe.execute()


async def delete(saver: BaseCheckpointSaver[Any], store: RunStore, redis: Redis, job: DeleteJob) -> str:
    outcome = STOPPED
    try:
        runs = await delete_conversation_data(saver, store, redis, job.conversation_id)
        outcome = "deleted"
        log.info("conversation.deleted", runs=runs, reason=job.reason)
        if job.reason == RETENTION:
            await _count_expired(redis)
    except Exception as exc:
        outcome = failure(exc)
        log.exception("conversation.delete_failed")
    finally:
        await _notify(redis, job, outcome)
    return outcome


async def _count_expired(redis: Redis) -> None:
    try:
        await redis.hincrby(METRICS_KEY, counter_field(CONVERSATIONS_EXPIRED), 1)  # type: ignore[misc]
    except RedisError as exc:  # a figure lost, nothing else
        log.warning("metrics.write_failed", error=str(exc))


async def _notify(redis: Redis, job: DeleteJob, outcome: str) -> None:
    key = deleted_key(job.claim)
    try:
        async with redis.pipeline(transaction=True) as pipe:
            release = scripts(redis).release_active
            await release(keys=[ACTIVE_RUNS], args=[job.conversation_id, job.claim], client=pipe)
            push(pipe, key, outcome)
            await pipe.execute()
    except RedisError as exc:
        # Start-up reconciliation frees a claim whose job is no longer queued.
        log.warning("conversation.release_failed", error=str(exc))


@entry_point(DeleteJob)
async def delete_job(ctx: dict[str, Any], job: DeleteJob) -> str:
    """arq's entry point (its job id is the delete's claim)."""
    return await delete(ctx["saver"], ctx["store"], ctx["redis"], job)
