"""A run's Redis Stream, read once per API process and shared by all of its SSE clients.

However many clients watch a run, this process reads its stream once (:class:`RunFeed`,
filled by the process's one blocking ``XREAD`` of every watched run:
api/chat/feedreader.py), keeps the newest entries in memory, already encoded as
SSE, and wakes the clients' relays when entries arrive. A relay that is behind
what the feed remembers (a late joiner, a reconnect, a slow reader) reads the
stream itself with ``XRANGE``, a bounded number at a time across the process
(:attr:`Feeds.replay_slots`), and then follows the feed.

Nothing here is held for a client: a relay only takes a reference to the feed
(:meth:`Feeds.acquire` / :meth:`Feeds.release`, both synchronous, so a cancelled
relay has nothing to clean up that could be interrupted). The reader lets a feed go
within one block once nobody watches it, or after its terminal entry.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass
from typing import Any

from litestar.response import ServerSentEventMessage
from redis.asyncio import Redis

from api.chat.feedreader import FeedReader
from shared.contracts.events import ENTRY_SEQ_MAX, EventType, entry_events, entry_span
from shared.redis.keys import events_key

#: Newest entries of a run a feed keeps in memory (per run, per API process), and their
#: most bytes (tool results can be large).
FEED_CAPACITY = 1000
FEED_MAX_BYTES = 8 * 1024 * 1024
#: XRANGE reads of relays that are behind, at once per process; bounds the connections they take.
REPLAY_SLOTS = 8
#: Entries per XRANGE (bounds what a relay holds while its client is slow).
REPLAY_BATCH = 100

_TERMINAL = frozenset({EventType.END.value, EventType.CHAT_ERROR.value})


@dataclass(frozen=True, slots=True)
class Entry:
    """One stream entry: SSE events ``first``..``n`` (one event, or tokens written together)."""

    first: int
    n: int
    type: str
    #: the SSE encoding of each of its events, made once for every client
    parts: tuple[bytes, ...]
    size: int

    @property
    def terminal(self) -> bool:
        return self.type in _TERMINAL


def entry_number(entry_id: Any) -> int:
    """The id of the last event in the entry ``entry_id``."""
    return entry_span(entry_id)[1]


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def make_entry(entry_id: Any, fields: dict[str, str]) -> Entry:
    events = entry_events(entry_id, fields)
    parts = tuple(
        ServerSentEventMessage(id=str(n), event=type_, data=data).encode() for n, type_, data in events
    )
    return Entry(events[0][0], events[-1][0], events[0][1], parts, sum(map(len, parts)))


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
        #: the stream id of the last entry read (XREAD goes on after it)
        self.cursor = "0-0"
        #: the terminal entry was read, or was already the stream's last entry
        self.ended = False
        #: the reader has stopped
        self.closed = False
        self.subscribers = 0
        self._changed = asyncio.Event()

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
        self.size += entry.size
        while len(self.entries) > self.feeds.capacity or (
            self.size > self.feeds.max_bytes and len(self.entries) > 1
        ):
            gone = self.entries.popleft()
            self.size -= gone.size
            self.floor = gone.n
        self.last = entry.n
        if entry.terminal:
            self.ended = True

    def begin(self, newest: tuple[Any, dict[str, str]] | None) -> None:
        """Start after ``newest``, the stream's newest entry when the feed starts (None: empty)."""
        self.start = self.floor = self.last = entry_number(newest[0]) if newest else 0
        self.cursor = _text(newest[0]) if newest else "0-0"
        self.ended = newest is not None and newest[1].get("type") in _TERMINAL
        self._notify()

    def take(self, entries: list[tuple[Any, dict[str, str]]]) -> None:
        """Entries the reader read after ``cursor``, in order."""
        for entry_id, fields in entries:
            self._append(make_entry(entry_id, fields))
        self.cursor = _text(entries[-1][0])
        self._notify()

    def close(self) -> None:
        """Nothing more is read into this feed (its relays see ``closed``)."""
        self.closed = True
        self._notify()


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
        #: reads every feed of ``_feeds``
        self.reader = FeedReader(redis, self._feeds.values, self.release_if_unwatched)

    def __len__(self) -> int:
        return len(self._feeds)

    def acquire(self, run_id: str) -> RunFeed:
        """The run's feed, its reader started if need be. Pair with :meth:`release`."""
        feed = self._feeds.get(run_id)
        # A feed closed after the terminal entry still answers; one closed for another reason
        # (the reader stopped) is replaced.
        if feed is None or (feed.closed and not feed.ended):
            feed = RunFeed(self, run_id)
            self._feeds[run_id] = feed
            feed.subscribers += 1
            if not self._closing:
                self.reader.watch()
            else:
                feed.closed = True
            return feed
        feed.subscribers += 1
        return feed

    def release(self, feed: RunFeed) -> None:
        feed.subscribers -= 1
        if feed.subscribers == 0 and feed.closed:
            self.forget(feed)

    def release_if_unwatched(self, feed: RunFeed) -> None:
        """The reader is done with ``feed``: forgotten now if nobody holds it, else at its last release."""
        if feed.subscribers == 0:
            self.forget(feed)

    def forget(self, feed: RunFeed) -> None:
        if self._feeds.get(feed.run_id) is feed:
            del self._feeds[feed.run_id]

    async def replay(self, run_id: str, pos: int, count: int = REPLAY_BATCH) -> list[Entry]:
        """Up to ``count`` entries with events after ``pos``, read from Redis: the first may
        hold ``pos`` too (tokens written together: the caller skips what it has sent)."""
        key = events_key(run_id)
        async with self.replay_slots:
            if pos == 0:
                raw = await self.redis.xrange(key, min="1-0", count=count)
            else:
                # The entry that holds event pos + 1 may start before it: the last one starting
                # at or before it, then those after (one round trip).
                async with self.redis.pipeline(transaction=False) as pipe:
                    pipe.xrevrange(key, max=f"{pos + 1}-{ENTRY_SEQ_MAX}", count=1)
                    pipe.xrange(key, min=f"{pos + 2}-0", count=count)
                    holding, after = await pipe.execute()
                raw = [*[e for e in holding if entry_span(e[0])[1] > pos], *after]
        return [make_entry(entry_id, fields) for entry_id, fields in raw]

    async def aclose(self) -> None:
        self._closing = True
        await self.reader.aclose()
        for feed in list(self._feeds.values()):  # a reader cancelled before it ran closed none
            if not feed.closed:
                feed.close()
                self.release_if_unwatched(feed)
