"""``POST /api/runs/{id}/cancel``: a queued run leaves the queue, a running one is cut at once.

**Queued.** One Lua script (shared/redis/scripts/), so it is all or nothing and races neither arq
nor a second cancel: if the run is in the queue and arq has not taken it (no in-progress key),
remove it from the queue, delete its arq job (if arq is just taking it, arq finds no job and drops
it: the run never starts), free its conversation (or, for a run waiting behind another, take it out
of the conversation's waiting list: it never takes its turn; such a run taken by the worker only to
be deferred is cancelled once it is back in the queue, a moment later), mark its description
``cancelled`` (with ``cancelled_by``, the caller), index it in ``CANCELLED_RUNS`` and name it in
``cancelled_run_key(conversation)``, publish its terminal ``end`` event and count it. The API never
writes SQLite and the run never reached the worker, so its Redis description *is* its record (kept
``CANCELLED_RETENTION_SECONDS``): nothing of it entered the conversation's thread, and a
conversation whose first run it was never existed in the database.

**Running** (or taken by arq and about to be recorded). In one transaction the API sets
``cancel_key(run)`` (the record, naming the caller: the worker reads it before the run's first step,
start-up recovery after a crash, and the run's ending for ``runs.cancelled_by``) and publishes the
run's id on ``CANCEL_CHANNEL``, to which the worker is subscribed: it cuts the run where it stands,
mid-answer or mid-tool, closes the thread (the answer so far kept and marked stopped, tool calls cut
short answered as stopped), records ``cancelled`` and publishes ``end`` (worker/run/lifetime/stopping.py). A
run that reaches its end first completes normally: the answer is then 409, as for any finished run.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import structlog

from api.auth.identity import caller
from api.runs import live
from api.runs.schemas import RunInfo
from api.runs.views import Runs
from shared.contracts.runs import RunStatus
from shared.contracts.webhooks import hook_keys_args
from shared.errors import NotFound, RunFinished
from shared.redis.keys import (
    ACTIVE_RUNS,
    CANCEL_CHANNEL,
    CANCELLED_RETENTION_SECONDS,
    CANCELLED_RUNS,
    QUEUE_NAME,
    arq_in_progress_key,
    arq_job_key,
    cancel_key,
    cancelled_run_key,
    events_key,
    run_key,
    waiting_key,
)
from shared.redis.metrics import METRICS_KEY, RUNS_FINISHED, counter_field
from shared.redis.scripts import scripts

log = structlog.get_logger(__name__)

#: how long a cancel request for a started run waits for the worker to see it
CANCEL_MARKER_SECONDS = 24 * 3600
#: how long a cancel waits for a run waiting for its turn to be back in the queue (it is taken
#: only for the moment its turn is looked at; past this it is cancelled as a taken run)
DEFERRING_WAIT_SECONDS = 2.0

@dataclass(frozen=True, slots=True)
class Cancelled:
    run: RunInfo
    #: True: the run is stopped; False: the worker has been asked to stop it
    done: bool


async def cancel_run(runs: Runs, run_id: str) -> Cancelled:
    """Cancel ``run_id`` (see the module docstring); idempotent. Raises NotFound, RunFinished."""
    redis = runs.redis
    who = caller().name  # recorded as the run's ``cancelledBy``
    await runs.get(run_id)  # NotFound for a run the caller may not see (api/auth/scope.py)
    # A run's conversation never changes: reading it first is safe, and names the script's last key.
    conversation = await redis.hget(run_key(run_id), "conversation") or ""  # type: ignore[misc]
    hook_keys, hook_args = hook_keys_args(run_id, conversation)  # its webhook, if it has one

    async def attempt() -> str:
        return str(await scripts(redis).cancel_queued(
            keys=[
                QUEUE_NAME,
                arq_job_key(run_id),
                arq_in_progress_key(run_id),
                run_key(run_id),
                ACTIVE_RUNS,
                events_key(run_id),
                CANCELLED_RUNS,
                METRICS_KEY,
                cancelled_run_key(conversation),
                waiting_key(conversation),
                *hook_keys,
            ],
            args=[
                run_id,
                f"{time.time():.6f}",
                str(CANCELLED_RETENTION_SECONDS),
                str(runs.settings.event_retention),
                counter_field(RUNS_FINISHED, status=RunStatus.CANCELLED.value),
                conversation,
                *hook_args,
                who,
            ],
        ))

    result = await attempt()
    # A run waiting for its turn is taken by the worker for an instant each time it is looked at
    # and deferred (worker/run/turns.py): cancelled once it is back in the queue, it never starts.
    deadline = time.monotonic() + DEFERRING_WAIT_SECONDS
    while result == "deferring" and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
        result = await attempt()
    if result in ("cancelled", "already"):
        info = await runs.get(run_id)
        structlog.contextvars.bind_contextvars(conversation_id=info.conversation)
        if result == "cancelled":
            log.info("run.cancelled", while_status="queued", waited_ms=info.waited_ms or 0)
        return Cancelled(info, done=True)

    found = await live.recorded_run(redis, run_id, runs.store.run)
    if found is not None and found.ended:
        # Finished (with or without a row: a run dropped or refused when the worker took it).
        structlog.contextvars.bind_contextvars(conversation_id=found.row.conversation_id)
        return _finished(await runs.get(run_id))
    if found is None or (not found.stored and result == "absent"):
        raise NotFound(f"run {run_id} not found")
    structlog.contextvars.bind_contextvars(conversation_id=found.row.conversation_id)

    # Running, or taken by the worker and about to be recorded: ask the worker. The marker
    # first (a worker that was not listening finds it), then the signal it hears at once.
    async with redis.pipeline(transaction=True) as pipe:
        marker = json.dumps({"requested_at": time.time(), "by": who})
        pipe.set(cancel_key(run_id), marker, ex=CANCEL_MARKER_SECONDS)
        pipe.publish(CANCEL_CHANNEL, run_id)
        await pipe.execute()
    info = await runs.get(run_id)
    if info.status.finished:
        # It ended between our two looks: the marker is moot.
        await redis.delete(cancel_key(run_id))
        return _finished(info)
    info.cancel_requested = True
    log.info("run.cancel_requested", while_status=info.status.value)
    return Cancelled(info, done=False)


def _finished(info: RunInfo) -> Cancelled:
    if info.status is RunStatus.CANCELLED:
        return Cancelled(info, done=True)  # cancelling twice is harmless
    raise RunFinished(f"run {info.id} already finished ({info.status.value}); there is nothing to cancel")

