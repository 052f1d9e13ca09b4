"""Threads: Sophos's conversations, plus the threads created empty, which have none yet.

``POST /threads`` writes a small Redis record (``protocol_thread_key``: its creation time and
metadata) and indexes it in ``PROTOCOL_THREADS``. Until its first run the record *is* the
thread (status ``idle``, no values); the first run creates its conversation under the same id
(``ChatService.submit_to_thread``), and from then on the conversation is the thread and the
record only keeps its metadata (the database has no column for it). A conversation started on
the native routes is a thread too, with empty metadata. Some metadata is the server's to say
(:data:`SERVER_METADATA`): ``owner`` always, and ``graph_id`` and ``assistant_id`` once the thread
has a run, as the Agent Server sets them on a run's thread (agent-chat-ui lists its threads by
``metadata.graph_id``). Deleting the conversation, by either
route or by retention, deletes the record (worker/upkeep/deletion.py).

A thread does not stay empty for ever: each user holds at most ``USER_MAX_EMPTY_THREADS`` of them
(the next create is 409 ``TOO_MANY_EMPTY_THREADS``), and the worker deletes one still empty after
``EMPTY_THREAD_RETENTION_MINUTES`` (worker/upkeep/expiry.py). A ``ttl`` (the Agent Server's
``{"strategy": "delete", "ttl": minutes}``) on a create or an update has the thread deleted that
long after its last activity, run or not.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any

import msgspec
import structlog
from redis.asyncio import Redis
from redis.exceptions import WatchError

from api.conversations.deletion import Deletions
from api.conversations.schemas import ConversationInfo
from api.conversations.views import Conversations
from api.http.ids import new_id
from api.protocol.threads.bodies import (
    FILTER_KEY,
    HISTORY_LIMIT_MAX,
    ThreadCreate,
    ThreadHistory,
    ThreadUpdate,
    before_of,
    thread_id_of,
    ttl_of,
)
from api.protocol.threads.found import Found, interrupts_by_task, settable, with_cut_noted
from api.protocol.threads.records import Record, Records
from api.protocol.threads.state import empty_state, thread_history, thread_state, thread_state_at
from api.resources import Resources
from api.store import Store
from shared.errors import BadRequest, NotFound, ThreadExists
from shared.redis.keys import PROTOCOL_THREAD_EXPIRY, PROTOCOL_THREADS, protocol_thread_key
from shared.redis.threads import forget_thread

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Threads:
    store: Store
    redis: Redis
    conversations: Conversations
    records: Records

    @classmethod
    def of(cls, resources: Resources) -> Threads:
        settings = resources.settings
        return cls(
            resources.store, resources.redis, Conversations(resources.store, resources.redis),
            Records(resources.store, resources.redis,
                    settings.empty_thread_retention_minutes, settings.user_max_empty_threads),
        )

    async def _info(self, thread_id: str) -> ConversationInfo | None:
        try:
            return await self.conversations.info(thread_id)
        except NotFound:
            return None

    async def find(self, thread_id: str) -> Found:
        """The thread, or NotFound."""
        record = await self.records.get(thread_id)
        info = await self._info(thread_id)
        if record is None and info is None:
            raise NotFound(f"thread {thread_id} not found")
        return Found(thread_id, record, info)

    async def create(self, body: ThreadCreate, *, first_look_minutes: float | None = None) -> Found:
        """Create the thread; the worker first looks at its expiry ``first_look_minutes`` from
        now (default: its ``ttl``, or the retention of empty threads)."""
        if body.supersteps:
            raise BadRequest("supersteps is not served by Sophos (docs/agent-protocol.md)")
        ttl = ttl_of(body.ttl)
        if body.if_exists not in (None, "raise", "do_nothing"):
            raise BadRequest("if_exists must be 'raise' or 'do_nothing'")
        thread_id = thread_id_of(body.thread_id) if body.thread_id else new_id()
        info = await self._info(thread_id)
        created = info is None and await self.records.claim(
            thread_id, settable(body.metadata), ttl, first_look_minutes
        )
        if not created:
            if info is None and await self.records.get(thread_id) is None:
                # Another user's thread: as absent here as everywhere (never 409: its existence
                # is not revealed), and not the caller's to create.
                raise NotFound(f"thread {thread_id} not found")
            if body.if_exists == "do_nothing":
                return await self.find(thread_id)
            raise ThreadExists(f"thread {thread_id} already exists")
        log.info("thread.created", conversation_id=thread_id)
        return Found(thread_id, await self.records.get(thread_id), None)

    async def get(self, thread_id: str) -> dict[str, Any]:
        found = await self.find(thread_id)
        state = await self.state_of(found)
        return found.shape(state["values"], interrupts_by_task(state))

    async def state(self, thread_id: str, checkpoint_id: str | None = None) -> dict[str, Any]:
        """The thread's state now, or at one of its checkpoints (NotFound for another)."""
        if checkpoint_id is None:
            return await self.state_of(await self.find(thread_id))
        checkpoint_id = before_of(checkpoint_id) or ""
        if not checkpoint_id:
            raise BadRequest("checkpoint_id must not be empty")
        found = await self.find(thread_id)
        state = None
        if found.info is not None:
            state = await self.store.read_thread(thread_id, functools.partial(thread_state_at, checkpoint_id))
        if state is None:
            raise NotFound(f"checkpoint {checkpoint_id} of thread {thread_id} not found")
        return state

    async def state_of(self, found: Found) -> dict[str, Any]:
        if found.info is None:
            return empty_state(found.id)
        state = await self.store.read_thread(found.id, thread_state)
        return with_cut_noted(found.info, state) if state is not None else empty_state(found.id)

    async def history(self, thread_id: str, query: ThreadHistory) -> list[dict[str, Any]]:
        """The thread's checkpoints, newest first (an empty thread has none)."""
        if query.select:
            raise BadRequest("select is not served by Sophos (docs/agent-protocol.md)")
        asked = query.checkpoint or {}
        if asked.get("checkpoint_ns") or asked.get("checkpoint_id"):
            raise BadRequest(
                "checkpoint is not served for a history: the agent has no subgraphs, and a history "
                "from a checkpoint is asked with before (docs/agent-protocol.md)"
            )
        if not 1 <= query.limit <= HISTORY_LIMIT_MAX:
            raise BadRequest(f"limit must be 1 to {HISTORY_LIMIT_MAX}")
        before = before_of(query.before)
        bad = [k for k in query.metadata or {} if not FILTER_KEY.fullmatch(k)]
        if bad:
            raise BadRequest(f"metadata keys are letters, digits, '_', '.' and '-'; not {bad[0][:64]!r}")
        found = await self.find(thread_id)
        if found.info is None:
            return []
        read = functools.partial(thread_history, query.limit, before, query.metadata)
        states = await self.store.read_thread(thread_id, read) or []
        if states and before is None and not query.metadata:  # the first is the head
            states[0] = with_cut_noted(found.info, states[0])
        return states

    async def update(self, thread_id: str, body: ThreadUpdate) -> dict[str, Any]:
        """Merge ``body.metadata`` into the thread's (a conversation started on the native routes
        gets its record here); the thread."""
        ttl = ttl_of(body.ttl)
        found = await self.find(thread_id)
        key = protocol_thread_key(thread_id)
        created = str(found.shape()["created_at"])  # a conversation started on /api/chat has no record yet
        async with self.redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(key)
                    current = Record.parse(thread_id, await pipe.hgetall(key))  # type: ignore[misc]
                    before = current.metadata if current is not None else {}
                    metadata = {**before, **settable(body.metadata)}
                    pipe.multi()
                    pipe.hset(key, mapping={
                        "created_at": current.created_at if current is not None else created,
                        "metadata": msgspec.json.encode(metadata).decode(),
                        "owner": found.owner,
                        **({"ttl": repr(ttl)} if ttl is not None else {}),
                    })
                    now = time.time()
                    if current is None:
                        pipe.zadd(PROTOCOL_THREADS, {thread_id: int(now * 1000)})
                    if ttl is not None:  # counted from now: an update is activity
                        pipe.zadd(PROTOCOL_THREAD_EXPIRY, {thread_id: int((now + 60.0 * ttl) * 1000)})
                    await pipe.execute()
                    break
                except WatchError:
                    continue  # another update came between: merge into it
        if found.record is None and await self._info(thread_id) is None:
            # Its conversation was deleted meanwhile: the record written above must not bring it
            # back as an empty thread (deleting the conversation deletes the record).
            async with self.redis.pipeline(transaction=True) as pipe:
                forget_thread(pipe, thread_id, None)
                await pipe.execute()
            raise NotFound(f"thread {thread_id} not found")
        log.info("thread.updated", conversation_id=thread_id)
        found = await self.find(thread_id)
        state = await self.state_of(found)
        return found.shape(state["values"], interrupts_by_task(state))

    async def delete(self, thread_id: str) -> None:
        """Delete the thread: its conversation as ``DELETE /api/conversations/{id}`` does (409 while
        a run holds it), then its record."""
        found = await self.find(thread_id)
        if found.info is not None:
            await Deletions(self.store, self.redis).delete(thread_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            forget_thread(pipe, thread_id, found.record.owner if found.record is not None else None)
            await pipe.execute()
        log.info("thread.deleted", conversation_id=thread_id)

