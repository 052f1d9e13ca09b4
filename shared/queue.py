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
from dataclasses import dataclass
from typing import Any

from arq.constants import expires_extra_ms
from arq.jobs import serialize_job
from redis.asyncio import Redis

from shared.contracts import (
    ACTIVE_RUNS,
    IDEMPOTENCY_TTL_SECONDS,
    JOB_FUNCTION,
    QUEUE_NAME,
    RELEASE_ACTIVE_LUA,
    WAKE_LIST,
    RunJob,
    arq_job_key,
    dumps,
    idempotency_key,
    run_key,
)

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
