"""A thread's record in Redis: what ``POST /threads`` writes, and its life until the thread runs.

The record (``protocol_thread_key``) holds a thread's creation time, metadata, owner and ``ttl``;
``PROTOCOL_THREADS`` indexes it, ``PROTOCOL_THREAD_EXPIRY`` has the worker look at its expiry
(worker/upkeep/expiry.py) and each user's empty threads are counted against
``USER_MAX_EMPTY_THREADS`` until their first run (api/protocol/threads/service.py tells the whole
story).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import WatchError

from api.auth.scope import owner_for_new, visible
from api.http.timefmt import iso_from_timestamp
from api.runs import live
from api.store import Store
from shared.errors import TooManyEmptyThreads
from shared.redis.keys import PROTOCOL_THREAD_EXPIRY, PROTOCOL_THREADS, empty_threads_key, protocol_thread_key
from shared.redis.scripts import scripts
from shared.redis.threads import ttl_minutes
from shared.users import LOCAL_USER


@dataclass(frozen=True, slots=True)
class Record:
    """A thread created by ``POST /threads``."""

    id: str
    created_at: str
    metadata: dict[str, Any]
    #: who created it (the server's to say: ``metadata.owner`` shows it, a client cannot set it)
    owner: str = LOCAL_USER
    #: minutes it is kept after its last activity (its ``ttl``), None: no ttl given
    ttl: float | None = None
    #: the assistant of its latest run with a message (None: none yet, or the default's)
    assistant_id: str | None = None

    @classmethod
    def parse(cls, thread_id: str, fields: dict[str, str]) -> Record | None:
        if not fields.get("created_at"):
            return None
        try:
            metadata = msgspec.json.decode(fields.get("metadata") or "{}")
        except msgspec.DecodeError:
            metadata = {}
        metadata = metadata if isinstance(metadata, dict) else {}
        return cls(
            thread_id, fields["created_at"], metadata, fields.get("owner") or LOCAL_USER,
            ttl_minutes(fields.get("ttl")), fields.get("assistant_id") or None,
        )



@dataclass(frozen=True, slots=True)
class Records:
    """The threads' records, as the caller may see them (api/auth/scope.py)."""

    store: Store
    redis: Redis
    #: EMPTY_THREAD_RETENTION_MINUTES and USER_MAX_EMPTY_THREADS (shared/settings.py)
    empty_minutes: float = 1440.0
    max_empty: int = 1000

    async def get(self, thread_id: str) -> Record | None:
        """The thread's record, if the caller may see it (api/auth/scope.py)."""
        fields: dict[str, str] = await self.redis.hgetall(protocol_thread_key(thread_id))  # type: ignore[misc]
        record = Record.parse(thread_id, fields)
        return record if record is not None and visible(record.owner) else None

    async def claim(
        self, thread_id: str, metadata: dict[str, Any], ttl: float | None = None,
        first_look_minutes: float | None = None,
    ) -> bool:
        """Write the thread's record unless it exists, whole in one script: of two creators one
        writes it, and the other never sees it half written (``metadata`` missing). The caller's
        empty threads may number at most :attr:`max_empty` (TooManyEmptyThreads)."""
        owner = owner_for_new()
        for attempt in range(2):
            now = time.time()
            first_look = first_look_minutes if first_look_minutes is not None else ttl
            due = now + 60.0 * (first_look if first_look is not None else self.empty_minutes)
            created = await scripts(self.redis).claim_thread(
                keys=[protocol_thread_key(thread_id), PROTOCOL_THREADS, PROTOCOL_THREAD_EXPIRY,
                      empty_threads_key(owner)],
                args=[iso_from_timestamp(now), msgspec.json.encode(metadata).decode(), owner,
                      str(int(now * 1000)), thread_id, str(int(due * 1000)), str(self.max_empty),
                      repr(ttl) if ttl is not None else ""],
            )
            if int(created) >= 0:
                return bool(created)
            if attempt == 0:
                await self._forget_no_longer_empty(owner)
        raise TooManyEmptyThreads(
            f"at most {self.max_empty} threads created empty (never run) per user "
            f"(USER_MAX_EMPTY_THREADS): run or delete one of them, or wait until one expires "
            f"({self.empty_minutes:g} minutes after its creation, EMPTY_THREAD_RETENTION_MINUTES)"
        )

    async def _forget_no_longer_empty(self, owner: str) -> None:
        """Drop from ``owner``'s empty threads the ones that had a run or are gone: a run's
        submission drops its thread (:meth:`ran`), but a process stopped between the two leaves it."""
        key = empty_threads_key(owner)
        ids: list[str] = await self.redis.zrange(key, 0, -1)
        claims = await live.active_runs(self.redis)
        stale = [
            i for i in ids
            if i in claims or not await self.redis.exists(protocol_thread_key(i))
            or await self.store.conversation(i) is not None
        ]
        if stale:
            await self.redis.zrem(key, *stale)

    async def ran(self, thread_id: str, owner: str) -> None:
        """The thread had its first run accepted (or a history copied into it): it is not empty
        any more (its conversation's retention, or its ``ttl``, governs it from now on)."""
        await self.redis.zrem(empty_threads_key(owner), thread_id)

    async def due_now(self, thread_id: str, ttl: float | None = None) -> None:
        """Have the worker look at the expiry of a thread with a ``ttl`` now (given ``ttl``, its
        new one): a thread whose run was just accepted (the run holds it; it goes ``ttl`` after
        the run's end), or whose run's answer was given. A thread deleted meanwhile is not put
        back."""
        def write(pipe: Pipeline) -> None:
            if ttl is not None:
                pipe.hset(protocol_thread_key(thread_id), "ttl", repr(ttl))
            pipe.zadd(PROTOCOL_THREAD_EXPIRY, {thread_id: int(time.time() * 1000)}, xx=True)

        await self._if_recorded(thread_id, write)

    async def ran_with(self, thread_id: str, assistant_id: str) -> None:
        """The thread's latest run is ``assistant_id``'s: its ``metadata.assistant_id`` says so from
        now on, as the Agent Server's does (clients such as agent-chat-ui list the threads of the
        assistant they show by it)."""
        await self._if_recorded(
            thread_id, lambda pipe: pipe.hset(protocol_thread_key(thread_id), "assistant_id", assistant_id)
        )

    async def _if_recorded(self, thread_id: str, write: Callable[[Pipeline], object]) -> None:
        """``write`` in one transaction if the thread has a record: one deleted meanwhile is not put back."""
        key = protocol_thread_key(thread_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(key)
                    if not await pipe.exists(key):
                        return
                    pipe.multi()
                    write(pipe)
                    await pipe.execute()
                    return
                except WatchError:
                    continue  # changed meanwhile: look again

