"""What Redis keeps of a thread made by the Agent Protocol's ``POST /threads``, and its forgetting.

A thread's record (``protocol_thread_key``) is indexed three ways: among the records
(``PROTOCOL_THREADS``), for the worker's look at its expiry (``PROTOCOL_THREAD_EXPIRY``) and,
while it has had no run, among its owner's empty threads (``empty_threads_key``). Whoever deletes
the thread (the API for an empty one, the worker's delete job for one with a conversation)
forgets all four here.
"""

from __future__ import annotations

from typing import Any

from shared.redis.keys import PROTOCOL_THREAD_EXPIRY, PROTOCOL_THREADS, empty_threads_key, protocol_thread_key

#: the ``ttl`` (minutes) of a thread to delete once its run has ended (a cron's tick thread with
#: ``on_run_completed: delete``, a run without a thread with ``on_completion: delete``): its
#: expiry (worker/upkeep/expiry.py) counts from the run's end
DELETE_AFTER_RUN_MINUTES = 0.01
#: the ``ttl`` (minutes) of the thread of a run without a thread (``on_completion: delete``)
#: whose answer an API process gives (``/runs/wait``, ``/runs/stream``): that process shortens it
#: to :data:`DELETE_AFTER_RUN_MINUTES` once it answered; if it stopped first, the thread goes this
#: long after its run's end all the same
ANSWER_GRACE_MINUTES = 1.0
#: when the worker first looks at such a thread if its run is never marked accepted (the API
#: process stopped between the two): the thread of a run that never was goes then
ACCEPTANCE_MINUTES = 1.0


def forget_thread(pipe: Any, thread_id: str, owner: str | None) -> None:
    """Queue on ``pipe`` (a Redis pipeline) the deletion of the thread's record and its indexes;
    ``owner``: the record's (None when it had none)."""
    pipe.delete(protocol_thread_key(thread_id))
    pipe.zrem(PROTOCOL_THREADS, thread_id)
    pipe.zrem(PROTOCOL_THREAD_EXPIRY, thread_id)
    if owner:
        pipe.zrem(empty_threads_key(owner), thread_id)


def thread_with_ttl(pipe: Any, thread_id: str, owner: str, ttl: float, created_at: str, now: float) -> None:
    """Queue on ``pipe`` the record of a thread made for a run, with a ``ttl`` (minutes), and its
    indexes: the worker deletes it once it has been idle that long."""
    pipe.hset(protocol_thread_key(thread_id), mapping={
        "created_at": created_at, "metadata": "{}", "owner": owner, "ttl": repr(ttl),
    })
    pipe.zadd(PROTOCOL_THREADS, {thread_id: int(now * 1000)})
    pipe.zadd(PROTOCOL_THREAD_EXPIRY, {thread_id: int((now + 60.0 * ttl) * 1000)})


def ttl_minutes(raw: str | bytes | None) -> float | None:
    """A record's ``ttl`` field: minutes, or None (none given, or unreadable)."""
    if raw is None:
        return None
    try:
        value = float(raw.decode() if isinstance(raw, bytes) else raw)
    except ValueError:
        return None
    return value if value > 0 else None
