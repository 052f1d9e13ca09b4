"""Submitting runs to the queue and releasing a conversation, atomically.

A run is accepted in one Lua script: claim the conversation in ``ACTIVE_RUNS``
(HSETNX), write arq's job record, add it to arq's queue, describe the run. Either
all of it happens or none, so a crash of the API between two steps cannot leave
a conversation claimed by a run that will never execute, and two simultaneous
requests for one conversation cannot both be accepted.

A run may also be accepted behind the conversation's active run instead of being
refused (``multitask_strategy`` ``enqueue``): the same script then leaves the claim as it
is and puts the run at the end of the conversation's waiting list (``waiting_key``). Its
job is queued all the same, so it waits in Redis, not in the API, and it claims the
conversation when the worker takes it (worker/run/turns.py). While a run waits, the
conversation counts as held for every other request too (a message, a delete), so nothing
overtakes it.

A request may carry an idempotency key: the script then looks for the answer of
an earlier request with that key first, and stores its own answer with the rest
when it is accepted. Retries of one request, however many and however close
together, start one run and all get its answer.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from arq.constants import expires_extra_ms
from redis.asyncio import Redis

from shared.contracts.codec import PayloadError, job_of_record, job_record
from shared.contracts.jobs import (
    COPY_FUNCTION,
    DELETE_FUNCTION,
    JOB_FUNCTION,
    PRUNE_FUNCTION,
    RENAME_FUNCTION,
    CopyJob,
    DeleteJob,
    PruneJob,
    RenameJob,
    RunJob,
)
from shared.contracts.runs import RunStatus
from shared.contracts.webhooks import hook_keys_args
from shared.redis.keys import (
    ACTIVE_RUNS,
    CANCELLED_RETENTION_SECONDS,
    IDEMPOTENCY_TTL_SECONDS,
    QUEUE_NAME,
    WAKE_LIST,
    arq_in_progress_key,
    arq_job_key,
    events_key,
    idempotency_key,
    run_key,
    user_runs_key,
    waiting_key,
)
from shared.redis.metrics import METRICS_KEY, RUNS_FINISHED, counter_field
from shared.redis.scripts import scripts


@dataclass(frozen=True, slots=True)
class Idempotency:
    """A request's ``Idempotency-Key`` and a fingerprint of what it asked for."""

    key: str
    fingerprint: str
    #: whose key it is
    owner: str = "local"


@dataclass(frozen=True, slots=True)
class FirstAnswer:
    """What the first request with an idempotency key was answered."""

    conversation: str
    run: str
    fingerprint: str

    @classmethod
    def parse(cls, raw: str | bytes) -> FirstAnswer:
        body = json.loads(raw)
        return cls(str(body["conversation"]), str(body["run"]), str(body["fingerprint"]))


@dataclass(frozen=True, slots=True)
class Submission:
    """Accepted (all None), refused (``holder``; ``active``: the owner's count of active runs,
    at their limit), answered before (``first``), or accepted behind the conversation's active
    run (``behind``: the run holding it, or else the first one still waiting for its turn)."""

    holder: str | None = None
    first: FirstAnswer | None = None
    behind: str | None = None
    active: int | None = None


async def first_answer(redis: Redis, idempotency: Idempotency) -> FirstAnswer | None:
    """The answer already given to a request with this idempotency key, if any."""
    raw = await redis.get(idempotency_key(idempotency.key, idempotency.owner))
    return FirstAnswer.parse(raw) if raw is not None else None


async def submit_run(redis: Redis, job: RunJob, *, title: str) -> str | None:
    """Enqueue ``job`` unless its conversation already has a queued or running run.

    Returns ``None`` when accepted, or the id of the run that holds the conversation.
    Raises redis errors as they are (the caller answers QUEUE_UNAVAILABLE).
    """
    return (await submit(redis, job, title=title)).holder


async def submit(
    redis: Redis, job: RunJob, *, title: str, idempotency: Idempotency | None = None, enqueue: bool = False,
    limit: int = 0,
) -> Submission:
    """Enqueue ``job`` unless its conversation is held, or its idempotency key was answered.

    ``enqueue``: a held conversation takes the run into its waiting list instead (a delete's
    claim still refuses it). ``limit``: refuse the run when its owner has that many runs queued
    or running already (0: no limit; the run is counted all the same).
    """
    # Its score: due now, or (``after_seconds``) later: no worker takes a job before its score.
    enqueue_ms = int(max(job.enqueued_at, job.due_at or 0.0) * 1000)
    payload = job_record(JOB_FUNCTION, job, job.enqueued_at)
    fields: dict[str, Any] = {
        "conversation": job.conversation_id,
        "kind": job.kind.value,
        "title": title,
        "enqueued_at": f"{job.enqueued_at:.6f}",
        "new_conversation": "1" if job.new_conversation else "0",
        "owner": job.owner,
        "started_by": job.started_by or job.owner,
        **({"due_at": f"{job.due_at:.6f}"} if job.due_at else {}),
    }
    flat = [x for kv in fields.items() for x in kv]
    answer = ""
    if idempotency is not None:
        answer = json.dumps({
            "conversation": job.conversation_id, "run": job.run_id, "fingerprint": idempotency.fingerprint,
        })
    reply = await scripts(redis).submit(
        keys=[
            ACTIVE_RUNS,
            arq_job_key(job.run_id),
            QUEUE_NAME,
            run_key(job.run_id),
            WAKE_LIST,
            # Without a key the script never touches KEYS[6]; it is named all the same.
            idempotency_key(idempotency.key, idempotency.owner)
            if idempotency is not None else idempotency_key(""),
            waiting_key(job.conversation_id),
            user_runs_key(job.owner),
        ],
        args=[
            job.conversation_id,
            job.run_id,
            payload,
            str(expires_extra_ms),
            str(enqueue_ms),
            str(IDEMPOTENCY_TTL_SECONDS if idempotency is not None else 0),
            answer,
            "1" if enqueue else "0",
            str(limit),
            *flat,
        ],
    )
    if reply is None:
        return Submission()
    kind, value = (v.decode() if isinstance(v, bytes) else str(v) for v in reply)
    if kind == "first":
        return Submission(first=FirstAnswer.parse(value))
    if kind == "behind":
        return Submission(behind=value)
    if kind == "quota":
        return Submission(active=int(value))
    return Submission(holder=value)


async def requeued(redis: Redis, run_id: str) -> None:
    """``run_id``, taken by a worker that died before starting it, is queued again (its in-progress
    marker deleted): back in the index of queued runs a scrape counts (``INDEX_REQUEUED_LUA``)."""
    await scripts(redis).index_requeued(keys=[run_key(run_id)], args=[run_id])


async def queued_job(redis: Redis, run_id: str) -> RunJob | None:
    """The job of ``run_id`` as arq keeps it (until the job ends), or None (gone, or not a run's)."""
    raw = await redis.get(arq_job_key(run_id))
    if raw is None:
        return None
    try:
        return job_of_record(RunJob, raw)
    except PayloadError:
        return None


async def release_conversation(redis: Redis, conversation_id: str, run_id: str) -> bool:
    """Free the conversation if (and only if) ``run_id`` still holds it."""
    n = await scripts(redis).release_active(keys=[ACTIVE_RUNS], args=[conversation_id, run_id])
    return bool(n)


# --- claims whose run will never run ------------------------------------------

#: How long the Redis description of a run that ended without a row is kept: the
#: record of a run refused by the database or dropped before it started (the
#: record of a run cancelled while queued is kept as long).
ENDED_RECORD_SECONDS = CANCELLED_RETENTION_SECONDS




async def record_ended(redis: Redis, run_id: str, conversation_id: str, fields: dict[str, str]) -> None:
    """Write ``fields`` into the run's Redis description, its only record when it has no row.

    With its conversation (the description may have expired: without it the API
    could not read the record) and a bound, ``ENDED_RECORD_SECONDS``.
    """
    flat = [x for kv in {"conversation": conversation_id, **fields}.items() for x in kv]
    await scripts(redis).record_ended(keys=[run_key(run_id)], args=[str(ENDED_RECORD_SECONDS), *flat])




async def gone_runs(redis: Redis, run_ids: list[str]) -> list[str]:
    """The runs of ``run_ids`` that arq will never run, all looked at in one instant (a script).

    Gone: not in arq's queue with its job record (a job arq runs stays queued until it
    ends), and not taken (arq's in-progress marker is set from taking a job to its end,
    so a job taken this instant is not gone). Once gone, a run stays gone: it leaves the
    queue once, its job record is never written again, and arq takes only a queued job
    (one whose record is missing it drops without running it). So no row can appear for
    a gone run after this look.
    """
    if not run_ids:
        return []
    keys = [QUEUE_NAME]
    for run_id in run_ids:
        keys += [arq_job_key(run_id), arq_in_progress_key(run_id)]
    positions = await scripts(redis).gone(keys=keys, args=run_ids)
    return [run_ids[int(i) - 1] for i in positions]


async def drop_unstarted(
    redis: Redis, conversation_id: str, run_id: str, *, code: str, message: str, event_retention: int
) -> bool:
    """Release a conversation whose run will never start, and record that run failed.

    One script, so it is all or nothing and races neither arq nor a new
    submission: only if the claim still names ``run_id`` and the run is still
    neither queued (with its job record) nor taken, release the claim, take the
    run out of the queue, mark its description ``failed`` with ``code`` and
    ``message`` (kept ``ENDED_RECORD_SECONDS``), publish its ``chat-error`` event
    and count it. A run whose description already records its end (refused by the
    database, which also published its ending: only its release was lost) keeps
    that record and is only released. True if the claim was released.
    """
    hook_keys, hook_args = hook_keys_args(run_id, conversation_id)  # its webhook, if it has one
    done = await scripts(redis).drop_unstarted(
        keys=[
            ACTIVE_RUNS,
            QUEUE_NAME,
            arq_job_key(run_id),
            arq_in_progress_key(run_id),
            run_key(run_id),
            events_key(run_id),
            METRICS_KEY,
            *hook_keys,
        ],
        args=[
            conversation_id,
            run_id,
            f"{time.time():.6f}",
            str(ENDED_RECORD_SECONDS),
            str(event_retention),
            counter_field(RUNS_FINISHED, status=RunStatus.FAILED.value),
            code,
            message,
            *hook_args,
        ],
    )
    return bool(done)


async def submit_delete(redis: Redis, job: DeleteJob) -> str | None:
    """Claim the conversation for ``job`` and enqueue it, in one script, unless it is held.

    Returns None when claimed, else the holder: a run's id (queued or running) or
    another delete's claim. The delete and a submission exclude each other.
    """
    enqueue_ms = int(job.enqueued_at * 1000)
    payload = job_record(DELETE_FUNCTION, job, job.enqueued_at)
    reply = await scripts(redis).delete(
        keys=[ACTIVE_RUNS, arq_job_key(job.claim), QUEUE_NAME, WAKE_LIST, waiting_key(job.conversation_id)],
        args=[job.conversation_id, job.claim, payload, str(expires_extra_ms), str(enqueue_ms)],
    )
    return None if reply is None else (reply.decode() if isinstance(reply, bytes) else str(reply))


async def submit_job(redis: Redis, function: str, job_id: str, job: Any, enqueued_at: float) -> None:
    """Enqueue a job that claims nothing (a rename, a cron's creation or deletion): its arq
    record and its place in the queue, and wake a worker, atomically."""
    enqueue_ms = int(enqueued_at * 1000)
    record = job_record(function, job, enqueued_at)
    async with redis.pipeline(transaction=True) as pipe:
        pipe.set(arq_job_key(job_id), record, px=expires_extra_ms)
        pipe.zadd(QUEUE_NAME, {job_id: enqueue_ms})
        pipe.lpush(WAKE_LIST, "1")
        pipe.ltrim(WAKE_LIST, 0, 15)
        await pipe.execute()


async def submit_rename(redis: Redis, job: RenameJob) -> None:
    """Enqueue ``job`` and wake the worker, atomically (:func:`submit_job`)."""
    await submit_job(redis, RENAME_FUNCTION, job.job_id, job, job.enqueued_at)


async def submit_copy(redis: Redis, job: CopyJob) -> None:
    """Enqueue ``job`` and wake the worker, atomically (:func:`submit_job`)."""
    await submit_job(redis, COPY_FUNCTION, job.job_id, job, job.enqueued_at)


async def submit_prune(redis: Redis, job: PruneJob) -> None:
    """Enqueue ``job`` (one batch of a prune) and wake the worker, atomically (:func:`submit_job`).
    Each batch is its own arq job (``<job_id>:<batch>``): arq keeps a finished job's record."""
    await submit_job(redis, PRUNE_FUNCTION, f"{job.job_id}:{job.batch}", job, job.enqueued_at)
