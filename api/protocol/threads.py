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
"""

from __future__ import annotations

import functools
import re
import time
from dataclasses import dataclass
from typing import Any

import msgspec
import structlog
from redis.asyncio import Redis
from redis.exceptions import WatchError

from api.auth.scope import owner_for_new, visible
from api.conversations.deletion import Deletions
from api.conversations.schemas import ConversationInfo
from api.conversations.views import Conversations, queued_only, summary
from api.http.ids import new_id, parse_id
from api.http.timefmt import iso_from_timestamp
from api.protocol.state import empty_state, thread_history, thread_state, thread_state_at
from api.protocol.status import THREAD_STATUSES, thread_status
from api.runs import live
from api.runs.schemas import RunError
from api.store import ConversationRow, Store
from shared.contracts.protocol import ASSISTANT_ID, GRAPH_ID
from shared.contracts.runs import RunStatus
from shared.errors import BadRequest, NotFound, ThreadExists
from shared.redis.keys import PROTOCOL_THREADS, protocol_thread_key
from shared.redis.scripts import scripts
from shared.users import LOCAL_USER

log = structlog.get_logger(__name__)

#: a search looks at most at this many conversations (newest first) and threads created empty
SEARCH_SCAN = 5000
_PAGE = 500
SEARCH_LIMIT_MAX = 1000
#: metadata keys the server sets and a client cannot
SERVER_METADATA = frozenset({"owner", "graph_id", "assistant_id"})



class ThreadCreate(msgspec.Struct):
    """Body of ``POST /threads`` (the fields the SDK sends; the others are refused when set)."""

    thread_id: str | None = None
    metadata: dict[str, Any] | None = None
    if_exists: str | None = None
    supersteps: list[Any] | None = None
    ttl: Any = None


class ThreadSearch(msgspec.Struct):
    """Body of ``POST /threads/search``."""

    metadata: dict[str, Any] | None = None
    values: dict[str, Any] | None = None
    ids: list[str] | None = None
    status: str | None = None
    limit: int = 10
    offset: int = 0
    sort_by: str | None = None
    sort_order: str | None = None
    select: list[str] | None = None
    extract: dict[str, str] | None = None


class ThreadUpdate(msgspec.Struct):
    """Body of ``PATCH /threads/{id}``: metadata merged into the thread's (``ttl`` is refused)."""

    metadata: dict[str, Any] | None = None
    ttl: Any = None


class StateAt(msgspec.Struct):
    """Body of ``POST /threads/{id}/state/checkpoint``."""

    checkpoint: dict[str, Any]
    subgraphs: bool | None = None
    select: list[str] | None = None


class ThreadHistory(msgspec.Struct):
    """Body of ``POST /threads/{id}/history``."""

    limit: int = 10
    before: str | dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    checkpoint: dict[str, Any] | None = None
    select: list[str] | None = None


HISTORY_LIMIT_MAX = 1000
_CHECKPOINT_ID = re.compile(r"[0-9A-Za-z-]{1,64}")
#: the metadata keys a history can filter on: what LangGraph's savers take in a filter
_FILTER_KEY = re.compile(r"[0-9A-Za-z_.-]{1,128}")


def _before(value: str | dict[str, Any] | None) -> str | None:
    """The checkpoint id of ``before`` (an id, or a ``Checkpoint`` with one), checked."""
    if isinstance(value, dict):
        value = value.get("checkpoint_id")
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not _CHECKPOINT_ID.fullmatch(value):
        raise BadRequest("a checkpoint id is letters, digits and '-' (before: an id or a checkpoint)")
    return value


def thread_id_of(value: str) -> str:
    return parse_id(value, "thread_id")


@dataclass(frozen=True, slots=True)
class Record:
    """A thread created by ``POST /threads``."""

    id: str
    created_at: str
    metadata: dict[str, Any]
    #: who created it (the server's to say: ``metadata.owner`` shows it, a client cannot set it)
    owner: str = LOCAL_USER

    @classmethod
    def parse(cls, thread_id: str, fields: dict[str, str]) -> Record | None:
        if not fields.get("created_at"):
            return None
        try:
            metadata = msgspec.json.decode(fields.get("metadata") or "{}")
        except msgspec.DecodeError:
            metadata = {}
        metadata = metadata if isinstance(metadata, dict) else {}
        return cls(thread_id, fields["created_at"], metadata, fields.get("owner") or LOCAL_USER)


@dataclass(frozen=True, slots=True)
class Found:
    """A thread: its record (None: started on the native routes), its conversation (None: empty)."""

    id: str
    record: Record | None
    info: ConversationInfo | None

    @property
    def status(self) -> str:
        return thread_status(self.info)

    @property
    def owner(self) -> str:
        if self.info is not None and isinstance(self.info.owner, str):
            return self.info.owner  # a conversation's row (or queued run) says whose it is
        return self.record.owner if self.record is not None else LOCAL_USER

    @property
    def metadata(self) -> dict[str, Any]:
        """The client's metadata with the server's (:data:`SERVER_METADATA`) over it."""
        ran = {"graph_id": GRAPH_ID, "assistant_id": ASSISTANT_ID} if self.info is not None else {}
        return {**(self.record.metadata if self.record is not None else {}), **ran, "owner": self.owner}

    def shape(
        self, values: dict[str, Any] | None = None, interrupts: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The SDK's ``Thread``."""
        created = self.record.created_at if self.record is not None else None
        if self.info is not None:
            created = min(created or self.info.created_at, self.info.created_at)
        updated = self.info.updated_at if self.info is not None else created
        return {
            "thread_id": self.id,
            "created_at": created,
            "updated_at": updated,
            "metadata": self.metadata,
            "status": self.status,
            "values": values if values is not None else {},
            "interrupts": interrupts or {},
            "config": {},
            "error": None,
        }


def _matches(found: Found, query: ThreadSearch) -> bool:
    if query.status is not None and found.status != query.status:
        return False
    metadata = found.metadata
    return all(metadata.get(k) == v for k, v in (query.metadata or {}).items())


def settable(metadata: dict[str, Any] | None) -> dict[str, Any]:
    """What a client may set of a thread's metadata: all but :data:`SERVER_METADATA`."""
    return {k: v for k, v in (metadata or {}).items() if k not in SERVER_METADATA}


def _interrupts_by_task(state: dict[str, Any]) -> dict[str, Any]:
    """A ``Thread``'s ``interrupts``: each task's, by task id."""
    return {t["id"]: t["interrupts"] for t in state["tasks"] if t["interrupts"]}


#: what a thread whose run was cut (a crash, a drain) adds to its head's unfinished task
CUT_HINT = (
    " What was streamed of the step in flight was not kept. Send a new message to go on from the "
    "last step kept, or start a run with no input to resume the step."
)


def with_cut_noted(info: ConversationInfo | None, state: dict[str, Any]) -> dict[str, Any]:
    """``state`` (a head) with its last unfinished task's ``error`` set when the thread's last run
    was cut: a UI (the SDK's ``useStream``) shows it, instead of a bare pending step, as the
    reason the answer it streamed is gone. Other states as they are."""
    tasks = state.get("tasks") or []
    error = info.error if info is not None and info.status == RunStatus.INTERRUPTED else None
    if not tasks or not isinstance(error, RunError) or any(t["interrupts"] or t["error"] for t in tasks):
        return state
    noted = {"error": error.code, "message": f"{error.message}.{CUT_HINT}".replace("..", ".")}
    last = {**tasks[-1], "error": msgspec.json.encode(noted).decode()}
    return {**state, "tasks": [*tasks[:-1], last]}


@dataclass(frozen=True, slots=True)
class Threads:
    store: Store
    redis: Redis
    conversations: Conversations

    async def record(self, thread_id: str) -> Record | None:
        """The thread's record, if the caller may see it (api/auth/scope.py)."""
        fields: dict[str, str] = await self.redis.hgetall(protocol_thread_key(thread_id))  # type: ignore[misc]
        record = Record.parse(thread_id, fields)
        return record if record is not None and visible(record.owner) else None

    async def _info(self, thread_id: str) -> ConversationInfo | None:
        try:
            return await self.conversations.info(thread_id)
        except NotFound:
            return None

    async def find(self, thread_id: str) -> Found:
        """The thread, or NotFound."""
        record = await self.record(thread_id)
        info = await self._info(thread_id)
        if record is None and info is None:
            raise NotFound(f"thread {thread_id} not found")
        return Found(thread_id, record, info)

    async def create(self, body: ThreadCreate) -> Found:
        if body.supersteps:
            raise BadRequest("supersteps is not served by Sophos (docs/agent-protocol.md)")
        if body.ttl is not None:
            raise BadRequest("ttl is not served by Sophos (docs/agent-protocol.md)")
        if body.if_exists not in (None, "raise", "do_nothing"):
            raise BadRequest("if_exists must be 'raise' or 'do_nothing'")
        thread_id = thread_id_of(body.thread_id) if body.thread_id else new_id()
        info = await self._info(thread_id)
        created = info is None and await self.claim(thread_id, settable(body.metadata))
        if not created:
            if info is None and await self.record(thread_id) is None:
                # Another user's thread: as absent here as everywhere (never 409: its existence
                # is not revealed), and not the caller's to create.
                raise NotFound(f"thread {thread_id} not found")
            if body.if_exists == "do_nothing":
                return await self.find(thread_id)
            raise ThreadExists(f"thread {thread_id} already exists")
        log.info("thread.created", conversation_id=thread_id)
        return Found(thread_id, await self.record(thread_id), None)

    async def claim(self, thread_id: str, metadata: dict[str, Any]) -> bool:
        """Write the thread's record unless it exists, whole in one script: of two creators one
        writes it, and the other never sees it half written (``metadata`` missing)."""
        now = time.time()
        created = await scripts(self.redis).claim_thread(
            keys=[protocol_thread_key(thread_id), PROTOCOL_THREADS],
            args=[iso_from_timestamp(now), msgspec.json.encode(metadata).decode(), owner_for_new(),
                  str(int(now * 1000)), thread_id],
        )
        return bool(created)

    async def get(self, thread_id: str) -> dict[str, Any]:
        found = await self.find(thread_id)
        state = await self.state_of(found)
        return found.shape(state["values"], _interrupts_by_task(state))

    async def state(self, thread_id: str, checkpoint_id: str | None = None) -> dict[str, Any]:
        """The thread's state now, or at one of its checkpoints (NotFound for another)."""
        if checkpoint_id is None:
            return await self.state_of(await self.find(thread_id))
        checkpoint_id = _before(checkpoint_id) or ""
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
        before = _before(query.before)
        bad = [k for k in query.metadata or {} if not _FILTER_KEY.fullmatch(k)]
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
        if body.ttl is not None:
            raise BadRequest("ttl is not served by Sophos (docs/agent-protocol.md)")
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
                    })
                    if current is None:
                        pipe.zadd(PROTOCOL_THREADS, {thread_id: int(time.time() * 1000)})
                    await pipe.execute()
                    break
                except WatchError:
                    continue  # another update came between: merge into it
        if found.record is None and await self._info(thread_id) is None:
            # Its conversation was deleted meanwhile: the record written above must not bring it
            # back as an empty thread (deleting the conversation deletes the record).
            await self.redis.delete(key)
            await self.redis.zrem(PROTOCOL_THREADS, thread_id)
            raise NotFound(f"thread {thread_id} not found")
        log.info("thread.updated", conversation_id=thread_id)
        found = await self.find(thread_id)
        state = await self.state_of(found)
        return found.shape(state["values"], _interrupts_by_task(state))

    async def delete(self, thread_id: str) -> None:
        """Delete the thread: its conversation as ``DELETE /api/conversations/{id}`` does (409 while
        a run holds it), then its record."""
        found = await self.find(thread_id)
        if found.info is not None:
            await Deletions(self.store, self.redis).delete(thread_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(protocol_thread_key(thread_id))
            pipe.zrem(PROTOCOL_THREADS, thread_id)
            await pipe.execute()
        log.info("thread.deleted", conversation_id=thread_id)

    async def count(self, query: ThreadSearch) -> int:
        """How many threads ``query`` matches (``metadata``, ``status``, ``ids``; up to
        :data:`SEARCH_SCAN` of each kind, as a search looks at)."""
        return len([f for f in await self._filtered(query) if _matches(f, query)])

    async def _filtered(self, query: ThreadSearch) -> list[Found]:
        """The threads a search or a count looks at (``ids``, else all), its filters checked."""
        if query.values or query.extract or query.select:
            raise BadRequest("values, select and extract are not served by Sophos (docs/agent-protocol.md)")
        if query.status is not None and query.status not in THREAD_STATUSES:
            raise BadRequest(f"status must be one of {', '.join(sorted(THREAD_STATUSES))}")
        if query.ids is not None:
            ids = [thread_id_of(i) for i in query.ids]
            return [f for f in [await self._maybe(i) for i in dict.fromkeys(ids)] if f is not None]
        return await self._all()

    async def search(self, query: ThreadSearch) -> list[dict[str, Any]]:
        if not 1 <= query.limit <= SEARCH_LIMIT_MAX or query.offset < 0:
            raise BadRequest(f"limit must be 1 to {SEARCH_LIMIT_MAX} and offset at least 0")
        sort_by = query.sort_by or "created_at"
        if sort_by not in ("created_at", "updated_at", "thread_id", "status"):
            raise BadRequest("sort_by must be thread_id, status, created_at or updated_at")
        if query.sort_order not in (None, "asc", "desc"):
            raise BadRequest("sort_order must be asc or desc")
        found = await self._filtered(query)
        matched = [(f, f.shape()) for f in found if _matches(f, query)]
        matched.sort(
            key=lambda m: (m[1][sort_by] or "", m[1]["thread_id"]), reverse=query.sort_order != "asc"
        )
        # Each thread with its values, as the Agent Server answers (a UI titles a thread by its
        # first message): one state read per thread of the page, never of the whole scan, one
        # after the other (a read's timeout counts its wait for a reader: api/http/readers.py).
        page = []
        for found_one, _ in matched[query.offset : query.offset + query.limit]:
            state = await self.state_of(found_one)
            page.append(found_one.shape(state["values"], _interrupts_by_task(state)))
        return page

    async def _maybe(self, thread_id: str) -> Found | None:
        try:
            return await self.find(thread_id)
        except NotFound:
            return None

    async def _all(self) -> list[Found]:
        """Every thread, up to :data:`SEARCH_SCAN` of each kind, newest first."""
        claims = await live.active_runs(self.redis)
        rows: list[ConversationRow] = []
        before: tuple[str, str] | None = None
        while len(rows) < SEARCH_SCAN:
            page = await self.store.conversations(limit=_PAGE, before=before)
            rows += page
            if len(page) < _PAGE:
                break
            before = (page[-1].created_at, page[-1].id)
        active = await self.store.runs_by_id([claims[r.id] for r in rows if r.id in claims])
        record_ids: list[str] = await self.redis.zrevrange(PROTOCOL_THREADS, 0, SEARCH_SCAN - 1)
        async with self.redis.pipeline(transaction=False) as pipe:
            for thread_id in record_ids:
                pipe.hgetall(protocol_thread_key(thread_id))
            replies = await pipe.execute()
        parsed = (Record.parse(i, f) for i, f in zip(record_ids, replies, strict=True))
        records = {r.id: r for r in parsed if r is not None and visible(r.owner)}
        found: dict[str, Found] = {}
        for row in rows:
            claim = claims.get(row.id)
            info = summary(row, claim, active.get(claim) if claim is not None else None)
            found[row.id] = Found(row.id, records.get(row.id), info)
        # Threads with no conversation row: empty, or their first run still queued.
        waiting = [i for i in records if i not in found and i in claims]
        described = await live.described_runs(self.redis, [claims[i] for i in waiting])
        for thread_id, record in records.items():
            if thread_id in found:
                continue
            queued = described.get(claims.get(thread_id, ""))
            if queued is None and thread_id in claims:
                continue  # being recorded by the worker right now: listed next time
            found[thread_id] = Found(thread_id, record, queued_only(queued) if queued is not None else None)
        return list(found.values())
