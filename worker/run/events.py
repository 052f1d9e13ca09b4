"""Publishing a run's events to its Redis Stream.

Each event gets the next id of the run (1, 2, 3, ...) here, where it is
produced, and is stored as stream entry ``<id>-0``: every API process reads the
same ids, so ``Last-Event-ID`` means the same thing everywhere.

Events are the view, the checkpoint is the truth, so publishing must never hold
the run up nor fail it. :meth:`EventPublisher.publish` only appends the event to
a bounded buffer; one background task per run writes the buffer to Redis in
order, in batches (one pipelined round trip per batch; a batch waits
:data:`GATHER_SECONDS` for the events that follow it, unless a terminal event is
queued or a flush waits: a run's ~30 events take 4-5 writes instead of 8). While Redis is away the
buffer keeps the newest ``max(max_len, 1000)`` events and is written when it is back; events
that cannot be written within :data:`GIVE_UP_SECONDS` are dropped and counted
(an SSE client then gets a ``missed`` event for them, never silence). Only the
terminal event waits for the buffer to reach Redis, so a client that sees it can
trust it is the last one, and that wait is bounded by :data:`FLUSH_TIMEOUT`.

Retention: every write sets the stream's expiry (a day while the run is live,
``retention`` seconds once the terminal event is written) and trims it to about
``max_len`` entries (``MAXLEN ~``: Redis may keep up to one radix-tree node,
100 entries by default, more).
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
from shared.contracts.events import EventType
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
#: that relays them less per event. A terminal event is never held.
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
    #: an earlier write of it failed in a way that may still have stored it
    tried: bool = False


class EventPublisher:
    """Publishes the events of one run, in order, without making the run wait for Redis."""

    def __init__(
        self, redis: Redis, run_id: str, *, retention: int, max_len: int, new_stream: bool = False
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
        self._pending: deque[_Pending] = deque()
        self._inflight: list[_Pending] = []
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
        if len(self._pending) > self._buffer_limit:
            # Redis has been away for a while: keep the newest, as the stream would.
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
        (worker/run/ending.py) writes its terminal event in a script of its own, after it.
        """
        if self._pending:
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
        top = _entry_number(last[0][0]) if last else 0
        self._synced = True
        first = self._pending[0].id if self._pending else self.next_id
        if top >= first:
            shift = top + 1 - first
            for event in self._pending:
                event.id += shift
            self.next_id += shift

    async def _write_all(self) -> None:
        failing_since: float | None = None
        attempt = 0
        try:
            while self._pending:
                if not self._hurry.is_set() and len(self._pending) < _BATCH:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(GATHER_SECONDS):
                            await self._hurry.wait()
                try:
                    async with asyncio.timeout(WRITE_TIMEOUT):
                        if not self._synced:
                            await self._sync()
                        await self._write_batch()
                    failing_since, attempt = None, 0
                except (RedisError, OSError, TimeoutError) as exc:
                    # The batch may or may not have reached Redis: its next write tells.
                    for event in self._inflight:
                        event.tried = True
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
                        self.failures += len(self._pending)
                        log.error("events.dropped", count=len(self._pending))
                        self._pending.clear()
                        break
                    await asyncio.sleep(min(_RETRY_MAX_SECONDS, 0.05 * 2**attempt))
        finally:
            self._writer = None
            self._inflight = []
            if self._pending:
                # Cancelled with events left (the worker is stopping): they are lost.
                self.failures += len(self._pending)
                self._pending.clear()
            self._flushed.set()

    async def _write_batch(self) -> None:
        batch = self._inflight = [self._pending[i] for i in range(min(_BATCH, len(self._pending)))]
        terminal = any(e.type.terminal for e in batch)
        async with self.redis.pipeline(transaction=False) as pipe:
            for event in batch:
                pipe.xadd(
                    self.key,
                    {"type": event.type.value, "data": event.data},
                    id=f"{event.id}-0",
                    maxlen=self.max_len,
                    approximate=True,
                )
            pipe.expire(self.key, self.retention if terminal else max(self.retention, LIVE_TTL_SECONDS))
            along, self._along = self._along, []
            for queue in along:
                queue(pipe)
            replies = await pipe.execute(raise_on_error=False)
        self.writes += 1
        self._inflight = []
        taken: list[_Pending] = []
        for event, reply in zip(batch, replies, strict=False):
            if isinstance(reply, ResponseError):
                if _ID_TAKEN not in str(reply):
                    self.failures += 1
                    log.warning("events.rejected", event_id=event.id, error=str(reply))
                elif not event.tried:
                    # Entries we did not know of are ahead of ours (we could not look
                    # at the stream before the first write): number ours after them.
                    taken.append(event)
                # else: an earlier write of it that timed out did reach Redis.
            if self._pending and self._pending[0] is event:
                self._pending.popleft()
        for reply in replies[len(batch):]:
            if isinstance(reply, ResponseError):
                log.warning("events.write_failed", error=str(reply))
        if taken:
            self._pending.extendleft(reversed(taken))
            self._synced = False
            raise _IdTaken(f"{len(taken)} event id(s) already in the stream")


#: Redis's answer to an XADD whose id is not above the stream's last one.
_ID_TAKEN = "equal or smaller"


class _IdTaken(RedisError):
    """Ids were taken: look at the stream again, then write the rest."""


def _entry_number(entry_id: Any) -> int:
    raw = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
    return int(raw.split("-", 1)[0])
