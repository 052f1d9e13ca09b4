"""Start-up reconciliation: what a dead worker left behind.

Runs before the worker takes any job. There is exactly one worker (it holds the
writer lock), so every ``running`` row and every arq in-progress marker found
now belongs to a worker that died.

Such a run is recorded ``interrupted``, unless an operator had asked to cancel it
(its ``cancel_key`` is set): the worker died before the step boundary where it
would have stopped it, and the operator's request is honoured as the worker would
have (``cancelled``, no error, stream ends with ``end``). What was recorded of the
thread is the same either way, so it stays resumable iff a step was still to run.
If Redis cannot be read there, the run is recorded ``interrupted``, as before the
cancel existed: an outcome must be recorded, and that one is true either way.
"""

from __future__ import annotations

from typing import Any

import structlog
from langgraph.checkpoint.base import BaseCheckpointSaver
from redis.exceptions import RedisError

from shared.contracts import (
    ACTIVE_RUNS,
    QUEUE_NAME,
    JobKind,
    RunErrorCode,
    RunStatus,
    arq_in_progress_key,
    arq_job_key,
    arq_retry_key,
    cancel_key,
    progress_key,
)
from shared.queue import release_conversation
from worker.events import EventPublisher
from worker.runs import Outcome, RunService, notify_outcome

log = structlog.get_logger(__name__)

NOT_RECORDED = "the worker stopped before your message was recorded; please send it again"
RESUMABLE = "the worker stopped during the run; resume the conversation to finish it"
COMPLETE = "the worker stopped after the run's last step; its answer is complete"
UNREADABLE = "the worker stopped during the run, and the conversation's saved state cannot be read"


async def forget_job(service: RunService, run_id: str) -> None:
    """Remove a run's arq job so arq never re-runs it (it would after job_timeout + 10 s)."""
    async with service.redis.pipeline(transaction=True) as pipe:
        pipe.zrem(QUEUE_NAME, run_id)
        pipe.delete(arq_job_key(run_id), arq_in_progress_key(run_id), arq_retry_key(run_id))
        await pipe.execute()


async def _cancel_requested(service: RunService, run_id: str) -> bool:
    try:
        return bool(await service.redis.exists(cancel_key(run_id)))
    except RedisError as exc:
        log.warning("run.cancel_unreadable", run_id=run_id, error=str(exc))
        return False


async def recover(service: RunService, saver: BaseCheckpointSaver[Any]) -> int:
    """Mark orphaned runs ``interrupted`` (or ``cancelled``), clear their jobs, free their conversations."""
    orphans = await service.store.running_runs()
    for run in orphans:
        thread = service.thread_config(run.conversation_id)
        recorded = [c async for c in saver.alist(thread, filter={"run_id": run.id}, limit=1)]
        message_count: int | None = None
        pending: bool | None = None
        try:
            state = await service.graph.aget_state(thread)
            message_count, pending = len((state.values or {}).get("messages", [])), bool(state.tasks)
        except Exception as exc:
            # A thread that cannot be read (a crafted or damaged checkpoint) must not keep
            # the worker from starting: the run is recorded all the same, without counts.
            log.warning("run.state_unreadable", run_id=run.id, error=f"{type(exc).__name__}: {exc}")
        if not recorded and run.kind == JobKind.RUN.value:
            message = NOT_RECORDED
        elif pending is None:
            message = UNREADABLE
        elif pending:
            message = RESUMABLE
        else:
            message = COMPLETE
        cancelled = await _cancel_requested(service, run.id)
        if cancelled:
            outcome = Outcome(RunStatus.CANCELLED)
        else:
            outcome = Outcome(RunStatus.INTERRUPTED, RunErrorCode.INTERRUPTED, message)
        await service.store.finish_run(
            run.id, run.conversation_id,
            status=outcome.status, error_code=outcome.code, error_message=outcome.message,
            message_count=message_count, pending_tasks=pending,
        )
        await forget_job(service, run.id)
        # The dead worker's view of the run: its progress, and the cancel now honoured.
        await service.redis.delete(cancel_key(run.id), progress_key(run.id))
        events = EventPublisher(
            service.redis, run.id,
            retention=service.settings.event_retention, max_len=service.settings.event_max_per_run,
        )
        await events.start()
        await notify_outcome(service.redis, events, run.conversation_id, run.id, outcome)
        log.warning(
            "run.cancelled_by_crash" if cancelled else "run.interrupted_by_crash",
            run_id=run.id, conversation_id=run.conversation_id,
            input_recorded=bool(recorded), resumable=pending,
        )

    # Queued jobs: a marker left by the dead worker would hold them back until it
    # expires; jobs of runs that already started are done with (see above).
    for raw in await service.redis.zrange(QUEUE_NAME, 0, -1):
        run_id = raw.decode() if isinstance(raw, bytes) else str(raw)
        if await service.store.get_run(run_id) is not None:
            await forget_job(service, run_id)
        else:
            await service.redis.delete(arq_in_progress_key(run_id))

    # Conversations claimed by a run that is no longer queued (its outcome was
    # recorded but the worker died before freeing the conversation).
    claims: dict[bytes, bytes] = await service.redis.hgetall(ACTIVE_RUNS)  # type: ignore[misc]
    for conv_raw, run_raw in claims.items():
        conversation_id, run_id = conv_raw.decode(), run_raw.decode()
        if await service.redis.zscore(QUEUE_NAME, run_id) is None:
            await release_conversation(service.redis, conversation_id, run_id)
            log.warning("run.released_stale_claim", run_id=run_id, conversation_id=conversation_id)
    return len(orphans)
