"""Submitting runs to the queue and releasing a conversation, atomically.

A run is accepted in one Lua script: claim the conversation in ``ACTIVE_RUNS``
(HSETNX), write arq's job record, add it to arq's queue, describe the run. Either
all of it happens or none, so a crash of the API between two steps cannot leave
a conversation claimed by a run that will never execute, and two simultaneous
requests for one conversation cannot both be accepted.
"""

from __future__ import annotations

import time
from typing import Any

from arq.constants import expires_extra_ms
from arq.jobs import serialize_job
from redis.asyncio import Redis

from shared.contracts import (
    ACTIVE_RUNS,
    JOB_FUNCTION,
    QUEUE_NAME,
    RELEASE_ACTIVE_LUA,
    WAKE_LIST,
    RunJob,
    arq_job_key,
    dumps,
    run_key,
)

# KEYS: active hash, arq job key, arq queue, run hash, wake list
# ARGV: conversation, run, job bytes, job ttl ms, score, then run-hash field/value pairs
_SUBMIT_LUA = """
local holder = redis.call('HGET', KEYS[1], ARGV[1])
if holder then
  return holder
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[2])
redis.call('HSET', KEYS[4], unpack(ARGV, 6))
redis.call('PEXPIRE', KEYS[4], ARGV[4])
redis.call('LPUSH', KEYS[5], '1')
redis.call('LTRIM', KEYS[5], 0, 15)
return false
"""


async def submit_run(redis: Redis, job: RunJob, *, title: str) -> str | None:
    """Enqueue ``job`` unless its conversation already has a queued or running run.

    Returns ``None`` when accepted, or the id of the run that holds the conversation.
    Raises redis errors as they are (the caller answers QUEUE_UNAVAILABLE).
    """
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
    holder = await redis.eval(  # type: ignore[misc]
        _SUBMIT_LUA,
        5,
        ACTIVE_RUNS,
        arq_job_key(job.run_id),
        QUEUE_NAME,
        run_key(job.run_id),
        WAKE_LIST,
        job.conversation_id,
        job.run_id,
        payload,  # type: ignore[arg-type]  # redis-py accepts bytes; its stubs say str
        str(expires_extra_ms),
        str(enqueue_ms),
        *flat,
    )
    if holder is None:
        return None
    return holder.decode() if isinstance(holder, bytes) else str(holder)


async def release_conversation(redis: Redis, conversation_id: str, run_id: str) -> bool:
    """Free the conversation if (and only if) ``run_id`` still holds it."""
    n = await redis.eval(RELEASE_ACTIVE_LUA, 1, ACTIVE_RUNS, conversation_id, run_id)  # type: ignore[misc]
    return bool(n)


def now() -> float:
    return time.time()
