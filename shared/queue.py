"""Submitting runs to the queue and releasing a conversation, atomically.

A run is accepted in one Lua script: claim the conversation in ``ACTIVE_RUNS``
(HSETNX), write arq's job record, add it to arq's queue, describe the run. Either
all of it happens or none, so a crash of the API between two steps cannot leave
a conversation claimed by a run that will never execute, and two simultaneous
requests for one conversation cannot both be accepted.

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
from arq.jobs import serialize_job
from redis.asyncio import Redis

from shared.contracts import (
    ACTIVE_RUNS,
    CANCELLED_RETENTION_SECONDS,
    IDEMPOTENCY_TTL_SECONDS,
    JOB_FUNCTION,
    QUEUE_NAME,
    RELEASE_ACTIVE_LUA,
    WAKE_LIST,
    RunJob,
    RunStatus,
    arq_in_progress_key,
    arq_job_key,
    dumps,
    events_key,
    idempotency_key,
    run_key,
)
from shared.metrics import METRICS_KEY, RUNS_FINISHED, counter_field

# KEYS: active hash, arq job key, arq queue, run hash, wake list, idempotency key
# ARGV: conversation, run, job bytes, job ttl ms, score, idempotency ttl s ('0': no key),
#       this request's answer (for the idempotency key), then run-hash field/value pairs
_SUBMIT_LUA = """
if ARGV[6] ~= '0' then
  local first = redis.call('GET', KEYS[6])
  if first then
    return {'first', first}
  end
end
local holder = redis.call('HGET', KEYS[1], ARGV[1])
if holder then
  return {'held', holder}
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[2])
redis.call('HSET', KEYS[4], unpack(ARGV, 8))
redis.call('PEXPIRE', KEYS[4], ARGV[4])
if ARGV[6] ~= '0' then
  redis.call('SET', KEYS[6], ARGV[7], 'EX', ARGV[6])
end
redis.call('LPUSH', KEYS[5], '1')
redis.call('LTRIM', KEYS[5], 0, 15)
return false
"""


@dataclass(frozen=True, slots=True)
class Idempotency:
    """A request's ``Idempotency-Key`` and a fingerprint of what it asked for."""

    key: str
    fingerprint: str


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
    """Accepted (both None), refused (``holder``), or answered before (``first``)."""

    holder: str | None = None
    first: FirstAnswer | None = None


async def first_answer(redis: Redis, idempotency: Idempotency) -> FirstAnswer | None:
    """The answer already given to a request with this idempotency key, if any."""
    raw = await redis.get(idempotency_key(idempotency.key))
    return FirstAnswer.parse(raw) if raw is not None else None


async def submit_run(redis: Redis, job: RunJob, *, title: str) -> str | None:
    """Enqueue ``job`` unless its conversation already has a queued or running run.

    Returns ``None`` when accepted, or the id of the run that holds the conversation.
    Raises redis errors as they are (the caller answers QUEUE_UNAVAILABLE).
    """
    return (await submit(redis, job, title=title)).holder


async def submit(
    redis: Redis, job: RunJob, *, title: str, idempotency: Idempotency | None = None
) -> Submission:
    """Enqueue ``job`` unless its conversation is held, or its idempotency key was answered."""
    enqueue_ms = int(job.enqueued_at * 1000)
    payload = serialize_job(JOB_FUNCTION, (job.to_dict(),), {}, None, enqueue_ms, serializer=dumps)
    fields: dict[str, Any] = {
        "conversation": job.conversation_id,
        "kind": job.kind.value,
        "title": title,
        "enqueued_at": f"{job.enqueued_at:.6f}",
        "new_conversation": "1" if job.new_conversation else "0",
    }
    flat = [x for kv in fields.items() for x in kv]
    answer = ""
    if idempotency is not None:
        answer = json.dumps({
            "conversation": job.conversation_id, "run": job.run_id, "fingerprint": idempotency.fingerprint,
        })
    reply = await redis.eval(  # type: ignore[misc]
        _SUBMIT_LUA,
        6,
        ACTIVE_RUNS,
        arq_job_key(job.run_id),
        QUEUE_NAME,
        run_key(job.run_id),
        WAKE_LIST,
        # Without a key the script never touches KEYS[6]; it is named all the same.
        idempotency_key(idempotency.key if idempotency is not None else ""),
        job.conversation_id,
        job.run_id,
        payload,  # type: ignore[arg-type]  # redis-py accepts bytes; its stubs say str
        str(expires_extra_ms),
        str(enqueue_ms),
        str(IDEMPOTENCY_TTL_SECONDS if idempotency is not None else 0),
        answer,
        *flat,
    )
    if reply is None:
        return Submission()
    kind, value = (v.decode() if isinstance(v, bytes) else str(v) for v in reply)
    if kind == "first":
        return Submission(first=FirstAnswer.parse(value))
    return Submission(holder=value)


async def release_conversation(redis: Redis, conversation_id: str, run_id: str) -> bool:
    """Free the conversation if (and only if) ``run_id`` still holds it."""
    n = await redis.eval(RELEASE_ACTIVE_LUA, 1, ACTIVE_RUNS, conversation_id, run_id)  # type: ignore[misc]
    return bool(n)


# --- claims whose run will never run ------------------------------------------

#: How long the Redis description of a run that ended without a row is kept: the
#: record of a run refused by the database or dropped before it started (the
#: record of a run cancelled while queued is kept as long).
ENDED_RECORD_SECONDS = CANCELLED_RETENTION_SECONDS

# KEYS: run hash. ARGV: ttl (s), then field/value pairs.
# HSET alone would recreate an expired hash without a TTL: both go in one script.
_RECORD_ENDED_LUA = """
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('EXPIRE', KEYS[1], ARGV[1])
"""

# KEYS: active hash, queue, arq job, arq in-progress, run hash, events stream, metrics
# ARGV: conversation, run, now (s), record ttl (s), event ttl (s), metrics field, error code, message
# 1 if the claim was released (and the run recorded failed, its terminal event published); 2 if
# released only, the run being recorded already (refused by the database: only its release was
# lost); else 0.
_DROP_UNSTARTED_LUA = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then
  return 0
end
if redis.call('EXISTS', KEYS[4]) == 1 then
  return 0
end
local score = redis.call('ZSCORE', KEYS[2], ARGV[2])
if score and redis.call('EXISTS', KEYS[3]) == 1 then
  return 0
end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[2])
local ended = redis.call('HGET', KEYS[5], 'status')
if ended == 'failed' or ended == 'cancelled' then
  return 2
end
if score and redis.call('HEXISTS', KEYS[5], 'enqueued_at') == 0 then
  redis.call('HSET', KEYS[5], 'enqueued_at', string.format('%.3f', tonumber(score) / 1000))
end
redis.call('HSET', KEYS[5], 'conversation', ARGV[1], 'status', 'failed', 'failed_at', ARGV[3],
           'error_code', ARGV[7], 'error_message', ARGV[8])
redis.call('EXPIRE', KEYS[5], ARGV[4])
local n = 1
local last = redis.call('XREVRANGE', KEYS[6], '+', '-', 'COUNT', 1)
if last[1] then
  n = tonumber(string.match(last[1][1], '^(%d+)')) + 1
end
local data = cjson.encode({conversation = ARGV[1], run = ARGV[2], status = 'failed',
                           code = ARGV[7], message = ARGV[8]})
redis.call('XADD', KEYS[6], n .. '-0', 'type', 'chat-error', 'data', data)
redis.call('EXPIRE', KEYS[6], ARGV[5])
redis.call('HINCRBY', KEYS[7], ARGV[6], 1)
return 1
"""


async def record_ended(redis: Redis, run_id: str, conversation_id: str, fields: dict[str, str]) -> None:
    """Write ``fields`` into the run's Redis description, its only record when it has no row.

    With its conversation (the description may have expired: without it the API
    could not read the record) and a bound, ``ENDED_RECORD_SECONDS``.
    """
    flat = [x for kv in {"conversation": conversation_id, **fields}.items() for x in kv]
    await redis.eval(_RECORD_ENDED_LUA, 1, run_key(run_id), str(ENDED_RECORD_SECONDS), *flat)  # type: ignore[misc]


# KEYS: queue, then each run's arq job and arq in-progress keys. ARGV: the run ids.
# The positions (1-based) of the runs that are neither queued with their job nor taken.
_GONE_LUA = """
local gone = {}
for i, run in ipairs(ARGV) do
  local taken = redis.call('EXISTS', KEYS[2 * i + 1]) == 1
  local queued = redis.call('ZSCORE', KEYS[1], run) and redis.call('EXISTS', KEYS[2 * i]) == 1
  if not taken and not queued then
    gone[#gone + 1] = i
  end
end
return gone
"""


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
    positions = await redis.eval(_GONE_LUA, len(keys), *keys, *run_ids)  # type: ignore[misc]
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
    done = await redis.eval(  # type: ignore[misc]
        _DROP_UNSTARTED_LUA,
        7,
        ACTIVE_RUNS,
        QUEUE_NAME,
        arq_job_key(run_id),
        arq_in_progress_key(run_id),
        run_key(run_id),
        events_key(run_id),
        METRICS_KEY,
        conversation_id,
        run_id,
        f"{time.time():.6f}",
        str(ENDED_RECORD_SECONDS),
        str(event_retention),
        counter_field(RUNS_FINISHED, status=RunStatus.FAILED.value),
        code,
        message,
    )
    return bool(done)
