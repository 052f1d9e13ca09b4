"""A run's Redis Stream, read once per API process and shared by all of its SSE clients.

However many clients watch a run, this process holds one blocking ``XREAD`` on its
stream (:class:`RunFeed`), keeps the newest entries in memory, already encoded as
SSE, and wakes the clients' relays when entries arrive. A relay that is behind
what the feed remembers (a late joiner, a reconnect, a slow reader) reads the
stream itself with ``XRANGE``, a bounded number at a time across the process
(:attr:`Feeds.replay_slots`), and then follows the feed.

Nothing here is held for a client: a relay only takes a reference to the feed
(:meth:`Feeds.acquire` / :meth:`Feeds.release`, both synchronous, so a cancelled
relay has nothing to clean up that could be interrupted). The feed's reader stops
by itself within one block once nobody watches, or after the terminal entry.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass
from typing import Any

import structlog
from litestar.response import ServerSentEventMessage
from redis.asyncio import Redis
from redis.exceptions import RedisError

from shared.contracts.events import EventType
from shared.redis.keys import events_key

log = structlog.get_logger(__name__)

#: Newest entries of a run a feed keeps in memory (per run, per API process), and their
#: most bytes (tool results can be large).
FEED_CAPACITY = 1000
FEED_MAX_BYTES = 8 * 1024 * 1024
#: XRANGE reads of relays that are behind, at once per process; bounds the connections they take.
REPLAY_SLOTS = 8
#: Entries per XRANGE (bounds what a relay holds while its client is slow).
REPLAY_BATCH = 100
#: Longest XREAD BLOCK: the reader notices that nobody watches any more within this.
BLOCK_MS = 500
_READ_BATCH = 500
_RETRY_MAX_SECONDS = 2.0

_TERMINAL = frozenset({EventType.END.value, EventType.CHAT_ERROR.value})


@dataclass(frozen=True, slots=True)
class Entry:
    """One stream entry ``<n>-0``: SSE event ``n``."""

    n: int
    type: str
    #: the SSE encoding, made once for every client
    wire: bytes

    @property
    def terminal(self) -> bool:
        return self.type in _TERMINAL


def entry_number(entry_id: Any) -> int:
    raw = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
    return int(raw.split("-", 1)[0])


def make_entry(entry_id: Any, fields: dict[str, str]) -> Entry:
    n = entry_number(entry_id)
    type_ = fields.get("type", "")
    data = fields.get("data", "null")
    return Entry(n, type_, ServerSentEventMessage(id=str(n), event=type_, data=data).encode())


class RunFeed:
    """The live tail of one run's stream, for every relay of this process."""

    def __init__(self, feeds: Feeds, run_id: str) -> None:
        self.feeds = feeds
        self.run_id = run_id
        self.key = events_key(run_id)
        self.entries: deque[Entry] = deque()
        self.size = 0  # bytes in ``entries``
        #: every entry after this id has been read by the feed (None: not looked yet)
        self.start: int | None = None
        #: entries after this id are all in ``entries``
        self.floor = 0
        self.last = 0
        #: the terminal entry was read, or was already the stream's last entry
        self.ended = False
        #: the reader has stopped
        self.closed = False
        self.subscribers = 0
        self._changed = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def after(self, pos: int) -> list[Entry] | None:
        """The entries after ``pos``, or None if the feed cannot tell (read Redis instead)."""
        if self.start is None or pos < self.floor:
            return None
        found: list[Entry] = []
        for entry in reversed(self.entries):
            if entry.n <= pos:
                break
            found.append(entry)
        found.reverse()
        return found

    async def wait(self, pos: int, timeout: float) -> None:  # noqa: ASYNC109 - a bound on one wait
        """Return once the feed has something after ``pos``, changes, or ``timeout`` passes."""
        if self.last > pos or self.closed:
            return
        changed = self._changed
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await changed.wait()

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _append(self, entry: Entry) -> None:
        self.entries.append(entry)
        self.size += len(entry.wire)
        while len(self.entries) > self.feeds.capacity or (
            self.size > self.feeds.max_bytes and len(self.entries) > 1
        ):
            gone = self.entries.popleft()
            self.size -= len(gone.wire)
            self.floor = gone.n
        self.last = entry.n
        if entry.terminal:
            self.ended = True

    async def run(self) -> None:
        redis = self.feeds.redis
        failures = 0
        try:
            while self.subscribers > 0 and not self.ended:
                try:
                    if self.start is None:
                        newest = await redis.xrevrange(self.key, count=1)
                        self.start = self.floor = self.last = entry_number(newest[0][0]) if newest else 0
                        self.ended = bool(newest) and newest[0][1].get("type") in _TERMINAL
                        self._notify()
                        continue
                    reply = await redis.xread({self.key: f"{self.last}-0"}, count=_READ_BATCH, block=BLOCK_MS)
                except (RedisError, OSError) as exc:
                    failures += 1
                    log.warning(
                        "feed.redis_unavailable", run_id=self.run_id, error=str(exc), attempt=failures
                    )
                    await asyncio.sleep(min(_RETRY_MAX_SECONDS, 0.1 * 2 ** min(failures, 5)))
                    continue
                failures = 0
                if reply:
                    for entry_id, fields in reply[0][1]:
                        self._append(make_entry(entry_id, fields))
                    self._notify()
        finally:
            self.closed = True
            self._notify()
            if self.subscribers == 0:
                self.feeds.forget(self)


class Feeds:
    """The feeds of this API process, by run; opened and closed by the app's lifespan."""

    def __init__(
        self,
        redis: Redis,
        *,
        capacity: int = FEED_CAPACITY,
        max_bytes: int = FEED_MAX_BYTES,
        replay_slots: int = REPLAY_SLOTS,
    ) -> None:
        self.redis = redis
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.replay_slots = asyncio.Semaphore(replay_slots)
        self._feeds: dict[str, RunFeed] = {}
        self._closing = False

    def __len__(self) -> int:
        return len(self._feeds)

    def acquire(self, run_id: str) -> RunFeed:
        """The run's feed, its reader started if need be. Pair with :meth:`release`."""
        feed = self._feeds.get(run_id)
        # A feed whose reader stopped after the terminal entry still answers; one
        # stopped for another reason (Redis gone while nobody watched) is replaced.
        if feed is None or (feed.closed and not feed.ended):
            feed = RunFeed(self, run_id)
            self._feeds[run_id] = feed
            if not self._closing:
                feed.task = asyncio.create_task(feed.run(), name=f"feed-{run_id}")
            else:
                feed.closed = True
        feed.subscribers += 1
        return feed

    def release(self, feed: RunFeed) -> None:
        feed.subscribers -= 1
        if feed.subscribers == 0 and feed.closed:
            self.forget(feed)

    def forget(self, feed: RunFeed) -> None:
        if self._feeds.get(feed.run_id) is feed:
            del self._feeds[feed.run_id]

    async def replay(self, run_id: str, pos: int, count: int = REPLAY_BATCH) -> list[Entry]:
        """Up to ``count`` entries after ``pos``, read from Redis."""
        async with self.replay_slots:
            raw = await self.redis.xrange(events_key(run_id), min=f"{pos + 1}-0", count=count)
        return [make_entry(entry_id, fields) for entry_id, fields in raw]

    async def aclose(self) -> None:
        self._closing = True
        tasks = [f.task for f in self._feeds.values() if f.task is not None and not f.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
