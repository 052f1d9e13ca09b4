"""A run accepted behind another (``multitask_strategy`` ``enqueue``) takes its turn here.

Such a run waits in Redis, not in the API: its job is in arq's queue and its id in the
conversation's waiting list (shared/redis/queue.py), with no claim on the conversation. When the
worker takes the job, :func:`take_turn` claims the conversation for it in one script
(``CLAIM_TURN_LUA``), only if no run holds it and no run accepted earlier still waits:
runs enqueued on one thread start in the order they were accepted. Otherwise the job is
deferred (arq's ``Retry``). The ending of the run before it wakes it (``wake_next_turn``, a
rider of the ending's round trip, worker/run/outcome/ending.py): its job is due at once and an idle
worker woken. ``TURN_RETRY_SECONDS`` later it is looked at again all the same, for the ends
that wake no one: a crash found at start-up (worker/run/lifetime/recovery.py frees its claim), or an
ending that came between the look and the deferral. So the run starts once the run before it
has ended, whatever ended it.

The thread may have changed while the run waited, so what submission checks is checked
again here, before the run is recorded: a message behind a run that ended waiting for an
approval would abandon that approval, and a resume may find nothing left to resume. Such a
run ends ``failed`` through the one ending (worker/run/outcome/ending.py), as a run refused before it
was recorded: its Redis description is its record, its stream ends with ``chat-error``
naming why, and the conversation (its row, its thread, its pending approval) is untouched. It
is listed with the runs that ended without a row (``CANCELLED_RUNS``), so the runs of its
conversation show it, failed.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import structlog
from arq import Retry
from langgraph.graph.state import CompiledStateGraph
from redis.asyncio import Redis

from shared.contracts.jobs import JobKind, RunJob
from shared.contracts.runs import RunErrorCode, RunStatus
from shared.redis.keys import ACTIVE_RUNS, CANCELLED_RUNS, TAKEN_SECONDS, taken_key, waiting_key
from shared.redis.scripts import scripts
from shared.storage.threads.branch import thread_config
from worker.run.outcome.ending import APPROVAL_PENDING, Outcome, RunEnding, Thread
from worker.store import RunStore

log = structlog.get_logger(__name__)

#: How long a waiting run's job is deferred when its turn has not come: the ending of the run
#: before it wakes it sooner; arq looks again then all the same.
TURN_RETRY_SECONDS = 5.0
#: arq counts each deferral as a try: a run may wait this many times (longer than arq keeps a
#: job's record, a day), where arq's default would drop it after five.
TURN_TRIES = 1_000_000


async def take_turn(
    redis: Redis, store: RunStore, graph: CompiledStateGraph[Any, Any, Any, Any], ending: RunEnding,
    job: RunJob,
) -> RunJob | None:
    """``job`` to execute now (as its turn finds the thread), or None when it was refused and
    ended here. Raises arq's ``Retry`` while another run holds the conversation or comes first."""
    if not job.may_wait:
        return job  # accepted with the claim: no round trip on the path of every other run
    # On PostgreSQL the claim names its taker in the same script (``taken_key``): a worker that
    # dies right after it leaves a claim a live worker's sweep frees (worker/upkeep/sweep.py).
    reply = await scripts(redis).claim_turn(
        keys=[ACTIVE_RUNS, waiting_key(job.conversation_id), taken_key(job.run_id)],
        args=[job.conversation_id, job.run_id, store.owner or "", TAKEN_SECONDS],
    )
    kind, *rest = (v.decode() if isinstance(v, bytes) else str(v) for v in reply)
    if kind in ("held", "none"):
        return job  # accepted with the claim (or its turn taken on an earlier delivery)
    if kind == "behind":
        log.info("run.waiting_for_turn", behind=rest[0] if rest else None)
        raise Retry(defer=TURN_RETRY_SECONDS)
    log.info("run.turn_taken", waited_ms=round((time.time() - job.enqueued_at) * 1000))
    refusal = await _recheck(store, graph, job)
    if refusal is not None:
        log.info("run.refused_at_turn", error_code=refusal.code)
        await ending.end(job.run_id, job.conversation_id, refusal, thread=Thread(), recorded=False)
        # Described now (its record is what lists it): listed among its conversation's runs.
        await redis.zadd(CANCELLED_RUNS, {job.run_id: int(job.enqueued_at * 1000)})
        return None
    # The conversation exists by now (or never will: then the thread is empty), and the branch it
    # follows is the one of its last run, not the one read at submission.
    return dataclasses.replace(
        job, new_conversation=False, checkpoint_id=await store.branch_head(job.conversation_id),
    )


async def _recheck(
    store: RunStore, graph: CompiledStateGraph[Any, Any, Any, Any], job: RunJob,
) -> Outcome | None:
    """Why the run cannot start on the thread as it now stands, if it cannot."""
    if job.kind not in (JobKind.RUN, JobKind.RESUME):
        return None  # only messages and resumes are enqueued (api/protocol/runs/service.py)
    try:
        config = await thread_config(store.db.fetchall, job.conversation_id)
        state = await graph.aget_state(config)
    except Exception as exc:
        # Unreadable now: the run's own checks (worker/run/service.py) read the thread again.
        log.warning("run.turn_recheck_failed", error=f"{type(exc).__name__}: {exc}")
        return None
    if any(task.interrupts for task in state.tasks):
        what = "your message was not recorded" if job.kind is JobKind.RUN else "nothing was resumed"
        return Outcome(
            RunStatus.FAILED, APPROVAL_PENDING,
            "while this run waited, the thread came to wait for a decision on its tool calls "
            f"(an approval); {what}: send the decisions first"
            + (", then the message again" if job.kind is JobKind.RUN else ""),
        )
    if job.kind is JobKind.RESUME and job.command is None and not state.tasks:  # a Command needs none
        return Outcome(
            RunStatus.FAILED, RunErrorCode.RUN_NOT_RESUMABLE.value,
            "while this run waited, the thread came to have nothing left to resume",
        )
    return None
