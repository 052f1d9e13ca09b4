"""One blocking ``XREAD`` per API process, of every run its feeds watch (issue 44).

A feed per watched run (:class:`api.chat.feed.RunFeed`) keeps that run's newest entries; this
reader fills all of them. It reads every watched run's stream in one ``XREAD BLOCK`` (XREAD
takes many keys) and hands each its entries, so a thousand runs watched cost one blocked read
and one Redis connection, not a thousand.

A read already blocked does not see a run watched after it was sent. Watching one writes an
entry to this process's wake stream (:func:`shared.redis.keys.feeds_wake_key`), which every read
includes: the blocked read returns and the next one names the new run too. Wakes are written one
at a time, so a thousand streams opened at once cost a few wakes, not a thousand. A wake lost
(Redis away) costs at most one block (:data:`BLOCK_MS`), the read's bound.

A new feed's starting point (the stream's newest entry, as it is when the feed starts) is read
for every feed that needs one in one pipelined round trip. The reader stops when no feed is
left and starts again with the next one. Stopped otherwise (the process closing, a fault), it
closes every feed: their relays take fresh ones, which start it again.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterable
from typing import Any, Generic, Protocol, TypeVar

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

from shared.redis.keys import FEEDS_WAKE_TTL_SECONDS, feeds_wake_key


class WatchedFeed(Protocol):
    """What the reader uses of a run's feed (api/chat/feed.py ``RunFeed``): its stream, where
    the reader goes on from, whether anyone watches, and where it hands the entries."""

    key: str
    cursor: str
    start: int | None
    subscribers: int

    closed: bool
    ended: bool

    def begin(self, newest: tuple[Any, dict[str, str]] | None) -> None: ...

    def take(self, entries: list[tuple[Any, dict[str, str]]]) -> None: ...

    def close(self) -> None: ...

log = structlog.get_logger(__name__)

#: Longest XREAD BLOCK: a feed nobody watches any more is let go within this, and a lost wake
#: costs at most this.
BLOCK_MS = 500
#: Entries per stream and read.
READ_BATCH = 500
_RETRY_MAX_SECONDS = 2.0


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


F = TypeVar("F", bound=WatchedFeed)


class FeedReader(Generic[F]):
    """Reads every feed of ``feeds()`` (this process's, by run) in one blocking XREAD."""

    def __init__(
        self, redis: Redis, feeds: Callable[[], Iterable[F]], let_go: Callable[[F], None]
    ) -> None:
        self.redis = redis
        self._feeds = feeds
        #: called for a feed the reader is done with (ended, or watched by nobody)
        self._let_go = let_go
        self.wake_key = feeds_wake_key(uuid.uuid4().hex)
        #: the wake stream is read after this id: each wake is seen once
        self._wake_cursor = "0-0"
        self._wake_wanted = False
        self._waking: asyncio.Task[None] | None = None
        self.task: asyncio.Task[None] | None = None

    def watch(self) -> None:
        """A feed was added: read it too (the reader started if need be, its blocked read woken)."""
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self._run(), name="feed-reader")
            return  # its first read names every feed there is
        self._wake_wanted = True
        if self._waking is None or self._waking.done():
            self._waking = asyncio.create_task(self._wake(), name="feed-reader-wake")

    async def _wake(self) -> None:
        # One wake at a time; feeds added while one is written get the next (each read that
        # starts after a feed was added names it).
        while self._wake_wanted:
            self._wake_wanted = False
            try:
                async with self.redis.pipeline(transaction=True) as pipe:  # never without its TTL
                    pipe.xadd(self.wake_key, {"w": "1"}, maxlen=1, approximate=False)
                    pipe.expire(self.wake_key, FEEDS_WAKE_TTL_SECONDS)
                    await pipe.execute()
            except (RedisError, OSError) as exc:
                log.warning("feed.wake_failed", error=str(exc))
                return

    def _live(self) -> list[F]:
        """The feeds still to read; those done with are closed and let go."""
        live: list[F] = []
        for feed in list(self._feeds()):
            if feed.closed:
                continue
            if feed.ended or feed.subscribers == 0:
                feed.close()
                self._let_go(feed)
            else:
                live.append(feed)
        return live

    async def _begin(self, fresh: list[F]) -> None:
        """Each new feed's starting point: its stream's newest entry now, one round trip for all."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for feed in fresh:
                pipe.xrevrange(feed.key, count=1)
            newest = await pipe.execute()
        for feed, found in zip(fresh, newest, strict=True):
            feed.begin(found[0] if found else None)

    async def _run(self) -> None:
        failures = 0
        try:
            while live := self._live():
                try:
                    fresh = [feed for feed in live if feed.start is None]
                    if fresh:
                        await self._begin(fresh)
                        continue
                    streams: dict[Any, Any] = {feed.key: feed.cursor for feed in live}
                    streams[self.wake_key] = self._wake_cursor
                    reply = await self.redis.xread(streams, count=READ_BATCH, block=BLOCK_MS)
                except (RedisError, OSError) as exc:
                    failures += 1
                    log.warning("feed.redis_unavailable", feeds=len(live), error=str(exc), attempt=failures)
                    await asyncio.sleep(min(_RETRY_MAX_SECONDS, 0.1 * 2 ** min(failures, 5)))
                    continue
                failures = 0
                by_key = {feed.key: feed for feed in live}
                for key, entries in reply or ():
                    name = _text(key)
                    if name == self.wake_key:
                        self._wake_cursor = _text(entries[-1][0])
                    elif (feed := by_key.get(name)) is not None and entries:
                        feed.take(entries)
        except Exception:  # a fault of its own: logged here, its feeds closed below
            log.exception("feed.reader_failed")
        finally:
            # Stopped (the process closing, or a fault): its relays see their feeds closed and
            # take fresh ones, which start the reader again.
            for feed in list(self._feeds()):
                if not feed.closed:
                    feed.close()
                    self._let_go(feed)

    async def aclose(self) -> None:
        for task in (self.task, self._waking):
            if task is not None and not task.done():
                task.cancel()
        await asyncio.gather(*(t for t in (self.task, self._waking) if t is not None), return_exceptions=True)
