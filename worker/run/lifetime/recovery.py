"""Start-up reconciliation: what a dead worker left behind.

Runs before the worker takes any job. On SQLite there is exactly one worker (it
holds the writer lock), so every ``running`` row and every arq in-progress marker
found now belongs to a worker that died. On PostgreSQL other workers may be
running: only a run whose lease lapsed is a dead worker's, taken over first (and
every live worker keeps doing the same, worker/run/lifetime/leases.py).

Such a run is recorded ``interrupted``, unless an operator had asked to cancel it
(its ``cancel_key`` is set): the worker died before the step boundary where it
would have stopped it, and the operator's request is honoured as the worker would
have (``cancelled``, no error, stream ends with ``end``). What was recorded of the
thread is the same either way, so it stays resumable iff a step was still to run.
If Redis cannot be read there, the run is recorded ``interrupted``, as before the
cancel existed: an outcome must be recorded, and that one is true either way.

Damaged data costs only its own conversation, never the worker's start: nothing
read from a thread (whether the run's input was checkpointed, the thread's state)
is trusted to decode, and an orphan that cannot be reconciled at all is logged and
left for the others. Whether the input was checkpointed is asked of the table,
not by decoding a checkpoint (LangGraph's ``alist`` decodes every checkpoint and
write it yields, to answer what one row's metadata says).
"""

from __future__ import annotations

from typing import Any

import structlog
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from redis.asyncio import Redis
from redis.exceptions import RedisError

from shared import tracing
from shared.contracts.jobs import JobKind
from shared.contracts.runs import RunErrorCode, RunStatus
from shared.redis.keys import (
    QUEUE_NAME,
    arq_in_progress_key,
    arq_job_key,
    arq_retry_key,
    cancel_key,
    progress_key,
)
from shared.redis.queue import queued_job, requeued
from shared.storage import checkpoints
from shared.storage.threads.branch import thread_at
from worker.run.outcome.ending import Outcome, RunEnding
from worker.store import RunRow, RunStore, is_database_unavailable
from worker.upkeep.sweep import ClaimSweep

log = structlog.get_logger(__name__)

NOT_RECORDED = "the worker stopped before your message was recorded; please send it again"
RESUMABLE = "the worker stopped during the run; resume the conversation to finish it"
COMPLETE = "the worker stopped after the run's last step; its answer is complete"
UNREADABLE = "the worker stopped during the run, and the conversation's saved state cannot be read"


async def forget_job(redis: Redis, run_id: str) -> None:
    """Remove a run's arq job so arq never re-runs it (it would after job_timeout + 10 s)."""
    async with redis.pipeline(transaction=True) as pipe:
        pipe.zrem(QUEUE_NAME, run_id)
        pipe.delete(arq_job_key(run_id), arq_in_progress_key(run_id), arq_retry_key(run_id))
        await pipe.execute()


async def _cancel_requested(redis: Redis, run_id: str) -> bool:
    try:
        return bool(await redis.exists(cancel_key(run_id)))
    except RedisError as exc:
        log.warning("run.cancel_unreadable", run_id=run_id, error=str(exc))
        return False


async def input_recorded(saver: BaseCheckpointSaver[Any], thread: RunnableConfig, run_id: str) -> bool | None:
    """Whether a checkpoint of ``thread`` carries ``run_id``, decoding none; None if that cannot be read."""
    try:
        return await checkpoints.input_recorded(saver, thread, run_id)
    except Exception as exc:
        # Metadata that is not JSON makes the filter itself fail.
        log.warning("run.checkpoints_unreadable", run_id=run_id, error=f"{type(exc).__name__}: {exc}")
        return None


async def reconcile(
    redis: Redis, store: RunStore, ending: RunEnding, saver: BaseCheckpointSaver[Any], run: RunRow,
) -> None:
    """End one orphaned run (worker/run/outcome/ending.py), then clear its job and what its worker left
    in Redis.

    With tracing, the ending is a span in the run's own trace (its job, still in arq's keeping,
    carries its traceparent): the trace of a run whose worker died shows how it ended.
    """
    job = await queued_job(redis, run.id) if tracing.enabled() else None
    with tracing.span("recover run", {
        "sophos.run.id": run.id, "sophos.conversation.id": run.conversation_id,
        "sophos.recovery": "lease_lapsed" if store.owner is not None else "worker_restarted",
    }, parent=job.traceparent if job is not None else None) as span:
        status = await _reconcile(redis, ending, saver, run)
        span.set_attribute("sophos.run.status", status)


async def _reconcile(redis: Redis, ending: RunEnding, saver: BaseCheckpointSaver[Any], run: RunRow) -> str:
    recorded = await input_recorded(saver, thread_at(run.conversation_id), run.id)  # any branch
    # The branch the conversation follows. A thread that cannot be read (a crafted or damaged
    # checkpoint) must not keep the worker from starting: the run ends all the same, without counts.
    thread = await ending.read_thread(run.conversation_id, run.id)
    if recorded is False and run.kind == JobKind.RUN.value:
        message = NOT_RECORDED
    elif thread.pending is None:
        message = UNREADABLE
    elif thread.pending:
        message = RESUMABLE
    else:
        message = COMPLETE
    cancelled = await _cancel_requested(redis, run.id)
    if cancelled:
        cause = Outcome(RunStatus.CANCELLED)
    else:
        cause = Outcome(RunStatus.INTERRUPTED, RunErrorCode.INTERRUPTED, message)
    # (A pending interrupt makes it `waiting` again: the decision is still to be made.)
    outcome = await ending.end(run.id, run.conversation_id, cause, thread=thread)
    await forget_job(redis, run.id)
    # The dead worker's view of the run: its progress, and the cancel now honoured.
    await redis.delete(cancel_key(run.id), progress_key(run.id))
    log.warning(
        "run.cancelled_by_crash" if cancelled else "run.interrupted_by_crash",
        run_id=run.id, conversation_id=run.conversation_id, status=outcome.status.value,
        input_recorded=recorded, resumable=thread.pending,
    )
    return outcome.status.value


async def recover(
    redis: Redis, store: RunStore, ending: RunEnding, saver: BaseCheckpointSaver[Any], sweep: ClaimSweep,
) -> int:
    """Mark orphaned runs ``interrupted`` (or ``cancelled``), clear their jobs, free their conversations."""
    if store.owner is None:
        orphans = await store.running_runs()  # SQLite: this worker holds the writer lock
    else:
        # PostgreSQL: other workers may be running; only a lapsed lease is a dead worker's.
        orphans = [run for run in await store.lapsed_runs() if await store.take_over(run.id)]
    for run in orphans:
        try:
            await reconcile(redis, store, ending, saver, run)
        except Exception as exc:
            if is_database_unavailable(exc):
                raise  # nothing can be recorded: no run could be either
            # Whatever this run's data holds, the other conversations are served.
            log.exception("run.recovery_failed", run_id=run.id, conversation_id=run.conversation_id)

    # Queued jobs: a marker left by the dead worker would hold them back until it
    # expires; jobs of runs that already started are done with (see above). Only with
    # one worker: on PostgreSQL a marker or a queued job may be a live worker's.
    queued = await redis.zrange(QUEUE_NAME, 0, -1) if store.owner is None else []
    for raw in queued:
        run_id = raw.decode() if isinstance(raw, bytes) else str(raw)
        if await store.get_run(run_id) is not None:
            await forget_job(redis, run_id)
        elif await redis.delete(arq_in_progress_key(run_id)) and ":" not in run_id:
            await requeued(redis, run_id)  # a run taken and never started: counted queued again

    # Conversations claimed by a run that will not run: its outcome was recorded but
    # the worker died before freeing the conversation, or its job expired in the queue.
    # The live worker's sweep does the same every few seconds.
    await sweep.once()
    return len(orphans)
