"""Per-client limits: chat submissions per minute, and open event streams.

Submissions are counted in Redis, so every API process behind one port shares
one count per client address: a moving window of RATE_LIMIT_PER_MINUTE (the
``limits`` library's Lua script, atomic across processes). Every POST /api/chat
that passes authentication counts, accepted or not. Litestar's own
RateLimitMiddleware does not fit: it reads, changes and writes its count under
a lock of one process (concurrent requests to several processes overshoot) and
sends no Retry-After.

Open event streams are counted per API process: what a stream holds (a
connection, a task, a blocking Redis read) belongs to that process, and a count
that lives with the process cannot outlive it after a crash the way a Redis
counter would. With N processes behind one port a client can hold up to N times
MAX_STREAMS_PER_CLIENT streams in all.

The client address is the ASGI ``client``: the peer, or what X-Forwarded-For
names when the peer is one of FORWARDED_ALLOW_IPS (uvicorn's proxy headers).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from typing import Any
from urllib.parse import parse_qs

import structlog
from limits import RateLimitItemPerMinute
from limits.aio.storage import RedisStorage
from limits.aio.strategies import MovingWindowRateLimiter
from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler
from litestar.types import ASGIApp, Receive, Scope, Send
from redis.asyncio import Redis

from shared.errors import RateLimited

log = structlog.get_logger(__name__)

#: Prefix of the submission windows' keys in Redis.
RATE_LIMIT_PREFIX = "sophos:ratelimit"
EVENT_STREAM = "text/event-stream"


def client_address(scope: Scope | ASGIConnection[Any, Any, Any, Any]) -> str:
    client = scope.client if isinstance(scope, ASGIConnection) else scope.get("client")
    if client is None:
        return "unknown"
    return str(client[0] if isinstance(client, tuple | list) else client.host)


class SubmissionLimit:
    """At most ``per_minute`` chat submissions per client address in any 60 s, in Redis."""

    def __init__(self, per_minute: int) -> None:
        self.item = RateLimitItemPerMinute(per_minute) if per_minute > 0 else None
        self._limiter: MovingWindowRateLimiter | None = None
        self._redis: Redis | None = None

    def _limiter_for(self, redis: Redis) -> MovingWindowRateLimiter:
        # Over the API's own connection pool (its timeouts and retries), built on first use
        # because the pool is opened by the app's lifespan.
        if self._limiter is None or self._redis is not redis:
            storage = RedisStorage(
                "async+redis://",
                implementation="redispy",
                key_prefix=RATE_LIMIT_PREFIX,
                connection_pool=redis.connection_pool,  # type: ignore[arg-type]  # typed as scalars, passed on
            )
            self._limiter, self._redis = MovingWindowRateLimiter(storage), redis
        return self._limiter

    async def hit(self, redis: Redis, client: str) -> None:
        """Count one submission of ``client``; raise :class:`RateLimited` if over the limit."""
        if self.item is None:
            return
        limiter = self._limiter_for(redis)
        if await limiter.hit(self.item, "chat", client):
            return
        stats = await limiter.get_window_stats(self.item, "chat", client)
        retry_after = max(1, math.ceil(stats.reset_time - time.time()))
        log.warning("limit.submissions", client=client, limit=self.item.amount, retry_after=retry_after)
        raise RateLimited(
            f"too many chat submissions from this address: at most {self.item.amount} per minute; "
            f"retry in {retry_after} s",
            retry_after=retry_after,
        )


async def limit_submissions(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    """Guard of every way to submit a run: POST /api/chat and the Agent Protocol's run creation
    (``runs.create``, ``runs.stream``, ``runs.wait``), one limit per client address over them
    all. It runs after the token guard, so strangers spend no one's quota."""
    limit: SubmissionLimit = connection.app.state.submission_limit
    await limit.hit(connection.app.state.resources.redis, client_address(connection))


#: ``opt`` of a route that follows a run as a stream does (a relay of its events until its end)
#: without answering as one: the Agent Protocol's join and wait. True, or the name of the query
#: flag that makes it wait (``cancel?wait=1``).
FOLLOWS_A_RUN = "follows_a_run"
_TRUE = frozenset({"1", "true", "True"})


def follows_a_run(scope: Scope) -> bool:
    """The request holds a relay of a run for as long as it lasts: an event stream, or a route
    marked :data:`FOLLOWS_A_RUN` (then counted alike, for it holds as much)."""
    handler = scope.get("route_handler")
    if getattr(handler, "media_type", None) == EVENT_STREAM:
        return True
    follows = (getattr(handler, "opt", None) or {}).get(FOLLOWS_A_RUN)
    if isinstance(follows, str):
        flags = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        return any(value in _TRUE for value in flags.get(follows, []))
    return bool(follows)


class StreamLimit:
    """At most ``per_client`` open event streams per client address, in this process.

    ``middleware`` counts a request to an event-stream route (``text/event-stream``), or to a
    route that follows a run as one does (:func:`follows_a_run`), from its start until its
    response is over, the client gone included.
    """

    def __init__(self, per_client: int) -> None:
        self.per_client = per_client
        self.open: Counter[str] = Counter()

    def middleware(self, app: ASGIApp) -> ASGIApp:
        async def count_streams(scope: Scope, receive: Receive, send: Send) -> None:
            if self.per_client <= 0 or scope["type"] != "http" or not follows_a_run(scope):
                await app(scope, receive, send)
                return
            client = client_address(scope)
            if self.open[client] >= self.per_client:
                log.warning("limit.streams", client=client, limit=self.per_client)
                raise RateLimited(
                    f"too many open event streams from this address: at most {self.per_client}; "
                    "close one and retry"
                )
            self.open[client] += 1
            try:
                await app(scope, receive, send)
            finally:
                self.open[client] -= 1
                if self.open[client] <= 0:
                    del self.open[client]

        return count_streams
