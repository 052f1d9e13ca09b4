"""Publishing a run's events to its Redis Stream.

Each event gets the next id of the run (1, 2, 3, ...) here, where it is
produced, and is stored as stream entry ``<id>-0``, or, for tokens written together, in one
entry ``<first>-<k>`` with the tokens after it (shared/contracts/events.py): every API
process reads the same ids, so ``Last-Event-ID`` means the same thing everywhere.

Events are the view, the checkpoint is the truth, so publishing must never hold
the run up nor fail it. :meth:`EventPublisher.publish` only appends the event to
a bounded buffer; one background task per run writes the buffer to Redis in
order, in batches (one pipelined round trip per batch; a batch waits
``gather`` seconds (``EVENT_COALESCE_MS``) for the events that follow it, unless a terminal
event is queued, a flush waits or an entry's worth of tokens is there). The tokens of a batch
that follow each other share one stream entry, up to ``coalesce`` (``EVENT_COALESCE_TOKENS``)
each: one XADD, one entry for every API process to read and relay. An entry is formed once:
a write that failed is retried with the same entries, so one that did land is recognised
by its id (Redis refuses an id not above the stream's last). While Redis is away the
buffer keeps the newest ``max(max_len, 1000)`` events and is written when it is back; events
that cannot be written within :data:`GIVE_UP_SECONDS` are dropped and counted
(an SSE client then gets a ``missed`` event for them, never silence). Only the
terminal event waits for the buffer to reach Redis, so a client that sees it can
trust it is the last one, and that wait is bounded by :data:`FLUSH_TIMEOUT`.

Retention: the run's first write sets the stream's expiry to a day (the run is live; set
again if a run outlives half of that), a write with the terminal event to ``retention``
seconds; every write trims the stream to its newest ``max_len`` events (``MINID``, by event id:
an entry of tokens that starts before them goes with the older ones).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError, ResponseError

from shared.contracts.codec import dumps
from shared.contracts.events import EventType, entry_fields, entry_id, entry_span
from shared.redis.keys import events_key

log = structlog.get_logger(__name__)

#: While a run is live its stream must outlast any pause between events.
LIVE_TTL_SECONDS = 24 * 3600
#: One batch write (or the look at the stream's last id) that takes longer has failed.
WRITE_TIMEOUT = 2.0
#: How long the terminal event may wait for the buffer to reach Redis.
FLUSH_TIMEOUT = 5.0
#: Events that could not be written for this long are dropped.
GIVE_UP_SECONDS = 30.0
_BATCH = 200
#: A batch waits this long for the events that follow (a model streams its tokens
#: in bursts): fewer, larger writes cost the worker, Redis and every API process
#: that relays them less per event. A terminal event is never held. (The worker passes
#: ``EVENT_COALESCE_MS``; this is the default of a publisher built without it.)
GATHER_SECONDS = 0.002
#: Events held while Redis is away, at least (``max_len`` if larger).
_BUFFER_FLOOR = 1000
_RETRY_MAX_SECONDS = 1.0

# Background writers must not be garbage collected while they run (asyncio keeps
# only weak references to tasks).
_writers: set[asyncio.Task[None]] = set()


@dataclass(slots=True)
class _Pending:
    id: int
    type: EventType
    data: bytes


@dataclass(slots=True, eq=False)
class _Entry:
    """One stream entry being written: one event, or tokens that follow each other."""

    events: list[_Pending]
    #: an earlier write of it failed in a way that may still have stored it
    tried: bool = False

    @property
    def id(self) -> str:
        return entry_id(self.events[0].id, len(self.events))


class EventPublisher:
    """Publishes the events of one run, in order, without making the run wait for Redis."""

    def __init__(
        self, redis: Redis, run_id: str, *, retention: int, max_len: int, new_stream: bool = False,
        coalesce: int = 1, gather: float = GATHER_SECONDS,
    ) -> None:
        self.redis = redis
        self.run_id = run_id
        self.key = events_key(run_id)
        self.retention = retention
        self.max_len = max_len
        self.next_id = 1
        #: events that never reached Redis
        self.failures = 0
        #: round trips that wrote events (a run's events share as few as they can)
        self.writes = 0
        #: round trips that failed (what rode with them may or may not have been written)
        self.failed_writes = 0
        #: most tokens in one stream entry (1: an entry per event)
        self.coalesce = max(1, coalesce)
        self.gather = gather
        #: events not yet in an entry
        self._pending: deque[_Pending] = deque()
        #: entries formed and not yet known to be written, oldest first (all before ``_pending``)
        self._formed: deque[_Entry] = deque()
        self._inflight: list[_Entry] = []
        #: when the stream's live expiry was last set (monotonic; None: never by this publisher)
        self._expiry_set: float | None = None
        self._buffer_limit = max(max_len, _BUFFER_FLOOR)
        # next_id is known to follow the stream's last entry. A new run's stream is
        # empty, so it needs no look; if it is not, the first write tells (_IdTaken).
        self._synced = new_stream
        #: commands of others that ride with the next batch (see :meth:`along`)
        self._along: list[Callable[[Pipeline], None]] = []
        self._writer: asyncio.Task[None] | None = None
        self._flushed = asyncio.Event()
        self._flushed.set()
        #: a terminal event or a flush is waiting: batches no longer wait for followers
        self._hurry = asyncio.Event()
        #: a batch is worth writing now (an entry's worth of tokens, or a hurry)
        self._ready = asyncio.Event()
        self._enough = min(self.coalesce, _BATCH) if self.coalesce > 1 else _BATCH

    async def start(self) -> None:
        """Continue after the entries already in the stream (a run whose worker died).

        Bounded like a write; if Redis does not answer, the writer looks again
        before its first write.
        """
        try:
            async with asyncio.timeout(WRITE_TIMEOUT):
                await self._sync()
        except (RedisError, OSError, TimeoutError) as exc:
            log.warning("events.read_failed", error=str(exc) or type(exc).__name__)

    async def publish(self, type_: EventType, data: Any) -> int:
        """Queue an event and return its id. Only a terminal event waits, and boundedly."""
        event = _Pending(self.next_id, type_, dumps(data))
        self.next_id += 1
        self._pending.append(event)
        if len(self._pending) >= self._enough:
            self._ready.set()
        if len(self._pending) + sum(len(e.events) for e in self._formed) > self._buffer_limit:
            # Redis has been away for a while: keep the newest, as the stream would.
            if self._formed:
                self.failures += len(self._formed.popleft().events)
            else:
                self._pending.popleft()
                self.failures += 1
        self._flushed.clear()
        if self._writer is None:
            self._writer = asyncio.create_task(self._write_all(), name=f"events-{self.run_id}")
            _writers.add(self._writer)
            self._writer.add_done_callback(_writers.discard)
        if type_.terminal:
            await self.flush(FLUSH_TIMEOUT)
        return event.id

    async def flush(self, timeout: float) -> bool:  # noqa: ASYNC109 - a bound, not a deadline
        """Wait until every queued event reached Redis (or was dropped); False on timeout."""
        self._hurry.set()
        self._ready.set()
        try:
            async with asyncio.timeout(timeout):
                await self._flushed.wait()
        except TimeoutError:
            log.warning("events.flush_timeout", pending=len(self._pending), timeout=timeout)
            return False
        return True

    async def close(self) -> int:
        """Stop publishing: wait (bounded) for what is queued, drop what could not be written.

        Returns the id the next event would have had: the run's ending
        (worker/run/outcome/ending.py) writes its terminal event in a script of its own, after it.
        """
        if self._pending or self._formed:
            await self.flush(FLUSH_TIMEOUT)
        writer = self._writer
        if writer is not None:
            writer.cancel()
            await asyncio.wait({writer})  # (its cancellation is not ours: not raised here)
        return self.next_id

    def take_along(self) -> list[Callable[[Pipeline], None]]:
        """The commands of others still waiting for a batch (:meth:`along`), now the caller's."""
        along, self._along = self._along, []
        return along

    def along(self, queue: Callable[[Pipeline], None]) -> None:
        """Have ``queue`` add its commands to the pipeline of the next batch written.

        For writes that are a view and need no answer (a run's progress): they cost
        no round trip of their own. Lost if that batch's write fails.
        """
        self._along.append(queue)

    async def token(self, text: str) -> None:
        await self.publish(EventType.TOKEN, text)

    async def trace(self, step: int, node: str, event: str, name: str, data: Any = None) -> None:
        body: dict[str, Any] = {"step": step, "node": node, "event": event, "name": name}
        if data is not None:
            body["data"] = data
        await self.publish(EventType.TRACE, body)

    # --- the writer -------------------------------------------------------------

    async def _sync(self) -> None:
        """Number queued events after the stream's last entry."""
        last = await self.redis.xrevrange(self.key, count=1)
        top = entry_span(last[0][0])[1] if last else 0
        self._synced = True
        queued = [e for entry in self._formed for e in entry.events] + list(self._pending)
        first = queued[0].id if queued else self.next_id
        if top >= first:
            shift = top + 1 - first
            for event in queued:
                event.id += shift
            self.next_id += shift

    async def _write_all(self) -> None:
        failing_since: float | None = None
        attempt = 0
        try:
            while self._pending or self._formed:
                if not self._hurry.is_set() and not self._formed and len(self._pending) < self._enough:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self.gather):
                            await self._ready.wait()
                if not self._hurry.is_set():
                    self._ready.clear()
                try:
                    async with asyncio.timeout(WRITE_TIMEOUT):
                        if not self._synced:
                            await self._sync()
                        await self._write_batch()
                    failing_since, attempt = None, 0
                except (RedisError, OSError, TimeoutError) as exc:
                    # The batch may or may not have reached Redis: its next write tells.
                    for entry in self._inflight:
                        entry.tried = True
                    self.failed_writes += 1
                    now = time.monotonic()
                    failing_since = failing_since or now
                    attempt += 1
                    log.warning(
                        "events.publish_failed",
                        error=str(exc) or type(exc).__name__,
                        pending=len(self._pending),
                        attempt=attempt,
                    )
                    if now - failing_since >= GIVE_UP_SECONDS:
                        self._drop_all()
                        break
                    await asyncio.sleep(min(_RETRY_MAX_SECONDS, 0.05 * 2**attempt))
        finally:
            self._writer = None
            self._inflight = []
            # Cancelled with events left (the worker is stopping): they are lost.
            self._drop_all()
            self._flushed.set()

    def _drop_all(self) -> None:
        count = len(self._pending) + sum(len(e.events) for e in self._formed)
        if count:
            self.failures += count
            log.error("events.dropped", count=count)
        self._pending.clear()
        self._formed.clear()

    def _form(self) -> list[_Entry]:
        """The next batch's entries: those a failed write left, then new ones from ``_pending``
        (a token joins the token entry before it, formed in this batch, while it has room)."""
        size = sum(len(e.events) for e in self._formed)
        fresh: _Entry | None = None
        while self._pending and size < _BATCH:
            event = self._pending.popleft()
            size += 1
            if (
                fresh is not None and event.type is EventType.TOKEN
                and fresh.events[-1].type is EventType.TOKEN and len(fresh.events) < self.coalesce
            ):
                fresh.events.append(event)
                continue
            fresh = _Entry([event])
            self._formed.append(fresh)
        return list(self._formed)

    async def _write_batch(self) -> None:
        batch = self._inflight = self._form()
        terminal = any(e.type.terminal for entry in batch for e in entry.events)
        now = time.monotonic()
        expire = terminal or self._expiry_set is None or now - self._expiry_set >= LIVE_TTL_SECONDS / 2
        async with self.redis.pipeline(transaction=False) as pipe:
            for entry in batch:
                first, last = entry.events[0].id, entry.events[-1].id
                pipe.xadd(
                    self.key,
                    entry_fields(entry.events[0].type, [e.data for e in entry.events]),  # type: ignore[arg-type]  # redis-py's stubs: bytes values are fine
                    id=entry.id,
                    # The newest max_len events, by id (an entry may hold many): entries that
                    # start before them go; never the one written.
                    minid=f"{min(first, max(1, last - self.max_len + 1))}-0",
                    approximate=False,
                )
            if expire:
                pipe.expire(self.key, self.retention if terminal else max(self.retention, LIVE_TTL_SECONDS))
            along, self._along = self._along, []
            for queue in along:
                queue(pipe)
            replies = await pipe.execute(raise_on_error=False)
        self.writes += 1
        self._inflight = []
        if expire and not terminal and not isinstance(replies[len(batch)], ResponseError):
            self._expiry_set = now
        taken: list[_Pending] = []
        for entry, reply in zip(batch, replies, strict=False):
            if isinstance(reply, ResponseError):
                if _ID_TAKEN not in str(reply):
                    self.failures += len(entry.events)
                    log.warning("events.rejected", entry_id=entry.id, error=str(reply))
                elif not entry.tried:
                    # Entries we did not know of are ahead of ours (we could not look
                    # at the stream before the first write): number ours after them.
                    taken += entry.events
                # else: an earlier write of it that timed out did reach Redis.
            if self._formed and self._formed[0] is entry:
                self._formed.popleft()
        for reply in replies[len(batch):]:
            if isinstance(reply, ResponseError):
                log.warning("events.write_failed", error=str(reply))
        if taken:
            # Formed again once numbered after the stream's last entry.
            self._pending.extendleft(reversed(taken))
            self._synced = False
            raise _IdTaken(f"{len(taken)} event id(s) already in the stream")


#: Redis's answer to an XADD whose id is not above the stream's last one.
_ID_TAKEN = "equal or smaller"


class _IdTaken(RedisError):
    """Ids were taken: look at the stream again, then write the rest."""
