"""A run's Redis Stream relayed as Server-Sent Events.

Entry ``<n>-0`` of ``events_key(run)`` becomes the SSE event with ``id: n``, so a
client that reconnects with ``Last-Event-ID: n`` (to any API process) gets exactly
the entries after it. Every stream ends with the run's terminal event (``end`` or
``chat-error``); when the run finished long enough ago for its stream to expire,
the terminal event is rebuilt from the ``runs`` row.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
import structlog
from litestar.response import ServerSentEventMessage
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from api import live
from api.store import RunRow, Store
from shared.contracts import EventType, RunErrorCode, RunStatus, events_key
from shared.errors import BadRequest, NotFound, SophosError

log = structlog.get_logger(__name__)

MISSED = "missed"
_BATCH = 500
_BLOCK_MAX_MS = 500
_RETRY_MAX_SECONDS = 2.0


def parse_last_event_id(header: str | None, query: str | None) -> int:
    """The last event the client has seen (0: none). The header wins over the query."""
    raw = header if header not in (None, "") else query
    if raw in (None, ""):
        return 0
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise BadRequest(f"Last-Event-ID must be a non-negative integer, got {str(raw)[:32]!r}") from None
    if value < 0:
        raise BadRequest(f"Last-Event-ID must be a non-negative integer, got {value}")
    return value


def ping() -> ServerSentEventMessage:
    # data=None: an empty "data:" line would make browsers dispatch an empty message.
    return ServerSentEventMessage(comment="ping", data=None)


def terminal_from_row(run: RunRow, event_id: int) -> ServerSentEventMessage:
    """The terminal event of a finished run, rebuilt from its row (same shape as the worker's)."""
    body: dict[str, Any] = {"conversation": run.conversation_id, "run": run.id, "status": run.status}
    if run.status in (RunStatus.COMPLETED, RunStatus.CANCELLED):  # a cancelled run stopped as asked
        event = EventType.END
    else:
        event = EventType.CHAT_ERROR
        default_code = RunErrorCode.INTERRUPTED if run.status == RunStatus.INTERRUPTED else "AGENT_FAILURE"
        body["code"] = run.error_code or default_code
        body["message"] = run.error_message or f"the run {run.status}"
    return ServerSentEventMessage(id=str(event_id), event=event.value, data=json.dumps(body))


def _finished(run: RunRow) -> bool:
    return run.status in {s.value for s in RunStatus if s.finished}


async def current_run(store: Store, redis: Redis, conversation_id: str) -> str:
    """The run to stream: the conversation's queued or running run, else its last run."""
    holder = await live.active_run(redis, conversation_id)
    if holder is not None:
        return holder
    row = await store.conversation(conversation_id)
    if row is None or row.last_run_id is None:
        raise NotFound(f"conversation {conversation_id} not found")
    return row.last_run_id


@dataclass(slots=True)
class Relay:
    """Relays one run's events, from ``after`` on, until its terminal event."""

    redis: Redis
    store: Store
    conversation_id: str
    run_id: str
    after: int
    ping_ms: int
    #: set when the server begins to shut down
    draining: threading.Event

    @property
    def key(self) -> str:
        return events_key(self.run_id)

    async def ending(self) -> ServerSentEventMessage | None:
        """The answer for a client that can only be told how the run ended, if so.

        Either the run finished and its stream expired (the terminal event is rebuilt
        from the run's row), or the client has already seen the stream's terminal
        entry (it is sent again, with its own id).
        """
        newest = await self.redis.xrevrange(self.key, count=1)
        if newest:
            entry_id, fields = newest[0]
            n = int(str(entry_id).split("-", 1)[0])
            event_type = fields.get("type", "")
            if n <= self.after and event_type in (EventType.END, EventType.CHAT_ERROR):
                return ServerSentEventMessage(id=str(n), event=event_type, data=fields.get("data", "null"))
            return None
        run = await self.store.run(self.run_id)
        return terminal_from_row(run, self.after + 1) if run is not None and _finished(run) else None

    async def _finished_meanwhile(self) -> RunRow | None:
        try:
            run = await self.store.run(self.run_id)
        except SophosError as exc:
            log.warning("relay.run_lookup_failed", error=exc.message)
            return None
        return run if run is not None and _finished(run) else None

    async def events(self) -> AsyncIterator[ServerSentEventMessage]:
        """Yield the run's events after ``after``, pings while idle, then stop after the terminal one.

        Also stops (cleanly, so the client reconnects elsewhere with ``Last-Event-ID``)
        soon after ``draining`` is set by a shutting-down server.
        """
        # One connection of its own: XREAD BLOCK holds it while waiting.
        client = self.redis.client()
        expected = self.after + 1
        sent = 0
        idle_after_finish = False
        failures = 0
        # Short blocks, so a draining server is noticed well within uvicorn's grace period.
        block_ms = min(self.ping_ms, _BLOCK_MAX_MS)
        last_yield = time.monotonic()
        log.info("relay.opened", after=self.after)
        try:
            while not self.draining.is_set():
                try:
                    reply = await client.xread({self.key: f"{expected - 1}-0"}, count=_BATCH, block=block_ms)
                except (RedisConnectionError, RedisTimeoutError) as exc:
                    # Redis restarting: keep the client, retry from where we are.
                    failures += 1
                    log.warning("relay.redis_unavailable", error=str(exc), attempt=failures)
                    yield ping()
                    await anyio.sleep(min(_RETRY_MAX_SECONDS, 0.25 * 2 ** min(failures, 5)))
                    continue
                failures = 0
                entries = reply[0][1] if reply else []
                if not entries:
                    if time.monotonic() - last_yield < self.ping_ms / 1000:
                        continue
                    # Idle for a ping interval. A run can end without a terminal entry
                    # when its worker died: once its row says finished and a whole
                    # interval brought nothing (the worker publishes right after
                    # recording), rebuild the ending.
                    run = await self._finished_meanwhile()
                    if run is not None and idle_after_finish:
                        yield terminal_from_row(run, expected)
                        return
                    idle_after_finish = run is not None
                    yield ping()
                    last_yield = time.monotonic()
                    continue
                idle_after_finish = False
                for entry_id, fields in entries:
                    n = int(str(entry_id).split("-", 1)[0])
                    if n > expected:
                        # Trimmed before we read them: say so instead of skipping silently.
                        gap = {"from": expected, "to": n - 1}
                        yield ServerSentEventMessage(id=str(n - 1), event=MISSED, data=json.dumps(gap))
                    event_type = fields.get("type", "")
                    yield ServerSentEventMessage(id=str(n), event=event_type, data=fields.get("data", "null"))
                    sent += 1
                    expected = n + 1
                    if event_type in (EventType.END, EventType.CHAT_ERROR):
                        return
                last_yield = time.monotonic()
            log.info("relay.drained")
        finally:
            # Litestar cancels this generator when the client goes away: the
            # connection must still go back to the pool.
            with anyio.CancelScope(shield=True):
                await client.aclose()
                log.info("relay.closed", sent=sent, last_event_id=expected - 1)
