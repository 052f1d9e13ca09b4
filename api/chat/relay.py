"""A run's Redis Stream relayed as Server-Sent Events.

Event ``n`` of ``events_key(run)`` (entry ``<n>-0``, or one of the tokens of an entry
``<first>-<k>``: shared/contracts/events.py) becomes the SSE event with ``id: n``, so a
client that reconnects with ``Last-Event-ID: n`` (to any API process) gets exactly
the entries after it: the relay reads from an id, so there is no window between
"replay" and "subscribe" in which an event could slip by or come twice.

Every stream ends with the run's terminal event (``end`` or ``chat-error``). When
entries the client has not seen were trimmed (``EVENT_MAX_PER_RUN``) or never
reached Redis, a ``missed`` event says which ids are gone before the rest
follows. When the run finished long enough ago for its stream to expire
(``EVENT_RETENTION``), the client gets ``missed`` and the terminal event rebuilt
from the run's recorded ending (shared/redis/ended.py: its row, or for a run that
ended without one, what Redis recorded). A run of which nothing is known any more
(no row, no record, no events) is 404; one followed while that becomes so has its
stream closed after ``ENDING_PUBLISHED_WITHIN`` (a reconnect then gets the 404).
A client that has already seen the terminal event gets 204 No Content, which
tells an ``EventSource`` to stop reconnecting.
"""

from __future__ import annotations

import enum
import re
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio
import structlog
from litestar.response import ServerSentEventMessage
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from api.chat.feed import Entry, Feeds, entry_number
from api.http.timefmt import parse_iso
from api.runs import live
from api.runs.status import run_error
from api.store import RunRow, Store
from shared.contracts.codec import dumps
from shared.contracts.events import ENDING_PUBLISHED_WITHIN, EventType, body, event_type, terminal_event
from shared.errors import BadRequest, NotFound, SophosError
from shared.redis.ended import Recorded
from shared.redis.keys import events_key

log = structlog.get_logger(__name__)

MISSED = "missed"
#: Longest wait before the relay looks at the draining flag again.
_WAIT_MAX_SECONDS = 0.5
_RETRY_MAX_SECONDS = 2.0
#: A chunk written to the client holds at most about this much (several events).
_CHUNK_BYTES = 64 * 1024
_TERMINAL = frozenset({EventType.END.value, EventType.CHAT_ERROR.value})


#: The largest Last-Event-ID taken: stream ids are unsigned 64-bit and the relay reads
#: from the one after it, so anything above could not be asked of Redis (XRANGE refuses it).
LAST_EVENT_ID_MAX = 2**63 - 1
_LAST_EVENT_ID = re.compile(r"[0-9]{1,19}")


def parse_last_event_id(header: str | None, query: str | None) -> int:
    """The last event the client has seen (0: none). The header wins over the query."""
    raw = header if header not in (None, "") else query
    if raw in (None, ""):
        return 0
    text = str(raw).strip()
    # ASCII digits only: int() would also take "+1", "1_000" and other scripts' digits.
    if not _LAST_EVENT_ID.fullmatch(text) or int(text) > LAST_EVENT_ID_MAX:
        raise BadRequest(
            f"Last-Event-ID must be an integer from 0 to {LAST_EVENT_ID_MAX}, got {text[:32]!r}"
        )
    return int(text)


# data=None: an empty "data:" line would make browsers dispatch an empty message.
PING = ServerSentEventMessage(comment="ping", data=None).encode()


def missed(first: int, last: int | None, event_id: int) -> bytes:
    """The event saying ids ``first``..``last`` (None: unknown) will never come."""
    body = dumps({"from": first, "to": last}).decode()
    return ServerSentEventMessage(id=str(event_id), event=MISSED, data=body).encode()


def terminal_from_row(run: RunRow, event_id: int) -> bytes:
    """The terminal event of a finished run, rebuilt from its row (same shape as the worker's)."""
    error = run_error(run.status, run.error_code, run.error_message)
    code, message = (error.code, error.message) if error is not None else (None, None)
    event = terminal_event(run.conversation_id, run.id, run.status, code, message)
    return ServerSentEventMessage(
        id=str(event_id), event=event_type(event).value, data=dumps(body(event)).decode()
    ).encode()


def _finished_for(run: RunRow) -> float:
    """Seconds since the run's outcome was recorded, by the row's clock (inf if unknown)."""
    at = parse_iso(run.finished_at)
    return time.time() - at.timestamp() if at is not None else float("inf")


async def current_run(store: Store, redis: Redis, conversation_id: str) -> str:
    """The run to stream: the conversation's queued or running run, else its last accepted run.

    A run cancelled while queued never reaches SQLite, so the conversation's row
    still names the run before it: the one of the two accepted last is streamed.
    """
    holder = await live.active_run(redis, conversation_id)
    if holder is not None:
        return holder
    row = await store.conversation(conversation_id)
    last = row.last_run_id if row is not None else None
    cancelled = await live.cancelled_while_queued(redis, conversation_id)
    if cancelled is not None and (last is None or await _accepted_before(store, last, cancelled)):
        return cancelled.id
    if last is None:
        raise NotFound(f"conversation {conversation_id} not found")
    return last


async def _accepted_before(store: Store, run_id: str, cancelled: RunRow) -> bool:
    """Whether the recorded run ``run_id`` was accepted before ``cancelled`` was."""
    run = await store.run(run_id)
    accepted = parse_iso((run.enqueued_at or run.started_at) if run is not None else None)
    cancelled_accepted = parse_iso(cancelled.enqueued_at)
    return accepted is None or cancelled_accepted is None or accepted < cancelled_accepted


async def run_of_conversation(store: Store, redis: Redis, conversation_id: str, run_id: str) -> str:
    """``run_id``, if it is a run of this conversation (queued, running or finished)."""
    found = await live.recorded_run(redis, run_id, store.run)
    if found is None or found.row.conversation_id != conversation_id:
        raise NotFound(f"run {run_id} of conversation {conversation_id} not found")
    return run_id


class Ending(enum.Enum):
    #: the client has seen the terminal event: nothing more to say (204)
    SEEN = "seen"


class Unread(enum.Enum):
    #: the run's record could not be read (the database or Redis away): nothing is concluded
    UNREAD = "unread"


UNREAD = Unread.UNREAD


@dataclass(slots=True)
class Relay:
    """Relays one run's events, from ``after`` on, until its terminal event."""

    redis: Redis
    store: Store
    feeds: Feeds
    conversation_id: str
    run_id: str
    after: int
    ping_ms: int
    #: set when the server begins to shut down
    draining: threading.Event
    #: set when the stream was given up because nothing is known of the run any more
    unknown: bool = False

    @property
    def key(self) -> str:
        return events_key(self.run_id)

    async def ending(self) -> bytes | Ending | None:
        """What to answer without following the stream, if anything.

        :data:`Ending.SEEN` when the client has already seen the stream's terminal
        entry; the rebuilt ending (``missed``, then the terminal event) when the
        run finished and its stream expired; otherwise None: relay the stream.
        Raises NotFound when nothing is known of the run any more.
        """
        newest = await self.redis.xrevrange(self.key, count=1)
        if newest:
            entry_id, fields = newest[0]
            if entry_number(entry_id) <= self.after and fields.get("type") in _TERMINAL:
                return Ending.SEEN
            return None
        found = await live.recorded_run(self.redis, self.run_id, self.store.run)
        if found is None:
            raise NotFound(f"run {self.run_id} not found")
        if not found.ended or _finished_for(found.row) < ENDING_PUBLISHED_WITHIN:
            # Not finished, or finished so lately that its events may still be on their way
            # (the ending records the outcome first, worker/run/outcome/ending.py): follow the stream.
            return None
        log.info("relay.expired", after=self.after)
        return missed(self.after + 1, None, self.after) + terminal_from_row(found.row, self.after + 1)

    async def _look(self) -> Recorded | Unread | None:
        """What is recorded of the run now: :data:`UNREAD` when it could not be read."""
        try:
            return await live.recorded_run(self.redis, self.run_id, self.store.run)
        except (SophosError, RedisError) as exc:
            log.warning("relay.run_lookup_failed", error=str(exc))
            return UNREAD

    async def events(self) -> AsyncIterator[bytes]:
        """Yield the run's events after ``after`` (as SSE bytes), pings while idle, then
        stop after the terminal one.

        Also stops (cleanly, so the client reconnects elsewhere with ``Last-Event-ID``)
        soon after ``draining`` is set by a shutting-down server.
        """
        feed = self.feeds.acquire(self.run_id)
        pos = self.after
        sent = 0
        failures = 0
        idle_after_finish = False
        #: when this relay first found the run's row finished (monotonic)
        seen_finished: float | None = None
        #: since when nothing has been known of the run (monotonic)
        unknown_since: float | None = None
        last_write = time.monotonic()
        ping_s = self.ping_ms / 1000
        log.info("relay.opened", after=self.after)
        try:
            while not self.draining.is_set():
                if feed.closed and not feed.ended:
                    # Its reader was stopped (the process is closing): take a fresh one.
                    self.feeds.release(feed)
                    feed = self.feeds.acquire(self.run_id)
                    if feed.closed:
                        return
                entries = feed.after(pos)
                if entries is None:
                    try:
                        entries = await self.feeds.replay(self.run_id, pos)
                    except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                        # Redis restarting: keep the client, retry from where we are.
                        failures += 1
                        log.warning("relay.redis_unavailable", error=str(exc), attempt=failures)
                        yield PING
                        last_write = time.monotonic()
                        await anyio.sleep(min(_RETRY_MAX_SECONDS, 0.25 * 2 ** min(failures, 5)))
                        continue
                    failures = 0
                if entries:
                    chunk, pos, count, done = _encode(entries, pos)
                    yield chunk
                    sent += count
                    last_write = time.monotonic()
                    idle_after_finish = False
                    if done:
                        return
                    continue
                idle = time.monotonic() - last_write
                if idle < ping_s:
                    await feed.wait(pos, min(_WAIT_MAX_SECONDS, ping_s - idle))
                    continue
                # Idle for a ping interval. A run can end without a terminal entry
                # when Redis lost it or was away for longer than the worker kept trying, or
                # its stream expired before this relay looked: once its record says finished,
                # a whole interval brought nothing and the worker's bound for publishing after
                # recording has passed, rebuild the ending. A run of which nothing is known
                # any more (no row, no record, no events) is given up after that bound too.
                found = await self._look()
                now = time.monotonic()
                if found is None:
                    unknown_since = now if unknown_since is None else unknown_since
                    if now - unknown_since >= ENDING_PUBLISHED_WITHIN:
                        log.warning("relay.run_unknown", last_event_id=pos)
                        self.unknown = True
                        return
                else:
                    unknown_since = None
                run = found.row if isinstance(found, Recorded) and found.ended else None
                if run is not None:
                    seen_finished = now if seen_finished is None else seen_finished
                    waited = max(_finished_for(run), now - seen_finished)
                    if idle_after_finish and waited >= ENDING_PUBLISHED_WITHIN:
                        yield missed(pos + 1, None, pos) + terminal_from_row(run, pos + 1)
                        return
                idle_after_finish = run is not None
                yield PING
                last_write = time.monotonic()
            log.info("relay.drained")
        finally:
            # Synchronous on purpose: when the client goes away, Litestar cancels this
            # generator, and nothing awaited here could be relied on to run.
            self.feeds.release(feed)
            log.info("relay.closed", sent=sent, last_event_id=pos)


def _encode(entries: list[Entry], pos: int) -> tuple[bytes, int, int, bool]:
    """SSE bytes for entries after ``pos`` (with ``missed`` for gaps), up to one chunk.

    Returns the bytes, the new position, the number of events and whether the
    terminal event was among them.
    """
    parts: list[bytes] = []
    size = 0
    count = 0
    for entry in entries:
        if entry.n <= pos:
            continue
        if entry.first > pos + 1:
            # Trimmed before anyone read them, or never published: say so, never skip silently.
            gap = missed(pos + 1, entry.first - 1, entry.first - 1)
            parts.append(gap)
            count += 1
        # An entry of tokens written together may hold events the client has (a reconnect
        # inside it): from the one after ``pos``.
        sent = entry.parts if entry.first > pos else entry.parts[pos + 1 - entry.first:]
        parts.extend(sent)
        size += entry.size
        count += len(sent)
        pos = entry.n
        if entry.terminal:
            return b"".join(parts), pos, count, True
        if size >= _CHUNK_BYTES:
            break
    return b"".join(parts), pos, count, False
