"""The Redis protocol's scripts, in one place.

The keys are in :mod:`shared.redis.keys`; the events' shapes are in
:mod:`shared.contracts.events`; this module owns what is *done* with them atomically, the
Lua scripts. A run's ending in Redis is one Lua function, :data:`END_LUA` (with
``hook_run``, which enqueues its webhook), used by the three scripts that end a run:
the worker's (:data:`END_RUN_LUA`, whatever ended the run), the queued cancel and the
sweep's drop of a run that never started.

Scripts are registered once per Redis client (:func:`scripts`) with redis-py's
``register_script``: each call is an ``EVALSHA`` of the script's SHA-1, not the
whole text again, and on ``NOSCRIPT`` (Redis restarted, or ``SCRIPT FLUSH``)
redis-py loads the script and retries by itself. Queued in a pipeline, redis-py
checks the pipeline's scripts with one ``SCRIPT EXISTS`` and loads those missing
before sending it. Every script is atomic: that is why each is a script.

The scripts live by concern: a run's ending (ending.py), the scripts that move a run (runs.py),
the workers' heartbeats and the fair share's owners (workers.py), reading the queue (queue.py).
Every ``*_LUA`` text is importable from here.
"""

from __future__ import annotations

from hashlib import sha1
from weakref import WeakKeyDictionary

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

from shared.redis.scripts.ending import END_LUA, END_RUN_LUA, HOOK_LUA, LIVE_HEAD_LUA, QUEUED_INDEX_LUA
from shared.redis.scripts.queue import INDEX_REQUEUED_LUA, QUEUE_FIGURES_LUA, QUEUE_RANKS_LUA
from shared.redis.scripts.runs import (
    CANCEL_QUEUED_LUA,
    CLAIM_THREAD_LUA,
    CLAIM_TURN_LUA,
    DELETE_LUA,
    DROP_UNSTARTED_LUA,
    GONE_LUA,
    RECORD_ENDED_LUA,
    RELEASE_ACTIVE_LUA,
    SUBMIT_LUA,
    TAKE_LUA,
    WAKE_NEXT_TURN_LUA,
)
from shared.redis.scripts.workers import BEAT_LUA, OWNERS_LUA, STOP_BEATING_LUA

__all__ = [
    "BEAT_LUA", "CANCEL_QUEUED_LUA", "CLAIM_THREAD_LUA", "CLAIM_TURN_LUA", "DELETE_LUA", "DROP_UNSTARTED_LUA",
    "END_LUA", "END_RUN_LUA", "GONE_LUA", "HOOK_LUA", "INDEX_REQUEUED_LUA", "LIVE_HEAD_LUA", "OWNERS_LUA",
    "QUEUED_INDEX_LUA", "QUEUE_FIGURES_LUA", "QUEUE_RANKS_LUA", "RECORD_ENDED_LUA", "RELEASE_ACTIVE_LUA",
    "STOP_BEATING_LUA", "SUBMIT_LUA", "TAKE_LUA", "WAKE_NEXT_TURN_LUA", "WAKE_NEXT_TURN_SHA", "Scripts",
    "scripts",
]

class Scripts:
    """The scripts, registered with one Redis client: call one with ``keys=``, ``args=``
    (and ``client=pipe`` to queue it in a pipeline of that client)."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self.release_active: AsyncScript = redis.register_script(RELEASE_ACTIVE_LUA)
        self.end_run: AsyncScript = redis.register_script(END_RUN_LUA)
        self.hook: AsyncScript = redis.register_script(HOOK_LUA)
        self.submit: AsyncScript = redis.register_script(SUBMIT_LUA)
        self.claim_turn: AsyncScript = redis.register_script(CLAIM_TURN_LUA)
        self.record_ended: AsyncScript = redis.register_script(RECORD_ENDED_LUA)
        self.drop_unstarted: AsyncScript = redis.register_script(DROP_UNSTARTED_LUA)
        self.gone: AsyncScript = redis.register_script(GONE_LUA)
        self.cancel_queued: AsyncScript = redis.register_script(CANCEL_QUEUED_LUA)
        self.delete: AsyncScript = redis.register_script(DELETE_LUA)
        self.take: AsyncScript = redis.register_script(TAKE_LUA)
        self.owners: AsyncScript = redis.register_script(OWNERS_LUA)
        self.beat: AsyncScript = redis.register_script(BEAT_LUA)
        self.stop_beating: AsyncScript = redis.register_script(STOP_BEATING_LUA)
        self.queue_ranks: AsyncScript = redis.register_script(QUEUE_RANKS_LUA)
        self.queue_figures: AsyncScript = redis.register_script(QUEUE_FIGURES_LUA)
        self.index_requeued: AsyncScript = redis.register_script(INDEX_REQUEUED_LUA)
        self.wake_next_turn: AsyncScript = redis.register_script(WAKE_NEXT_TURN_LUA)
        self.claim_thread: AsyncScript = redis.register_script(CLAIM_THREAD_LUA)

    async def load(self) -> None:
        """SCRIPT LOAD every script (after a Redis restart emptied its cache): for the scripts
        queued by SHA in a pipeline, which redis-py does not load by itself."""
        for script in vars(self).values():
            if isinstance(script, AsyncScript):
                await self._redis.script_load(script.script)


#: the SHA-1 of :data:`WAKE_NEXT_TURN_LUA`, to queue it by SHA in a run's ending's pipeline
WAKE_NEXT_TURN_SHA = sha1(WAKE_NEXT_TURN_LUA.encode()).hexdigest()  # noqa: S324 - Redis's script id

_registered: WeakKeyDictionary[Redis, Scripts] = WeakKeyDictionary()


def scripts(redis: Redis) -> Scripts:
    """The scripts registered with ``redis``, once for the client's life."""
    registered = _registered.get(redis)
    if registered is None:
        registered = _registered[redis] = Scripts(redis)
    return registered
