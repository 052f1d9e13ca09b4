"""A Redis subscription held for a worker's life, subscribed again whenever its connection is lost.

Pub/sub keeps nothing for a subscriber that is away (a Redis restart, a dropped connection), so
its user is told of every subscription, the first and each one after a loss, as well as of every
message: it then reads again, once, whatever it may have missed. Used by the cancels
(worker/run/publish/progress.py) and the crons' ticker (worker/schedule/crons/ticker.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

log = structlog.get_logger(__name__)

#: an idle subscription is pinged this often: a dead connection is found and replaced
#: within this time, instead of failing silently
SUBSCRIPTION_PING_SECONDS = 5.0
_RESUBSCRIBE_MAX_SECONDS = 2.0


async def listen(
    redis: Redis, channel: str, *, subscribed: Callable[[], Awaitable[None]], heard: Callable[[str], object]
) -> None:
    """Until cancelled: ``await subscribed()`` after each subscription to ``channel``, and
    ``heard(data)`` for each message on it."""
    delay = 0.05
    while True:
        pubsub = redis.pubsub()
        try:
            await pubsub.subscribe(channel)
            while True:
                message = await pubsub.get_message(timeout=SUBSCRIPTION_PING_SECONDS)
                if message is None:
                    await pubsub.ping()  # a dead connection raises here rather than stay silent
                elif message["type"] == "subscribe":
                    # Also after redis-py reconnected by itself and subscribed again.
                    await subscribed()
                    delay = 0.05
                elif message["type"] == "message":
                    heard(_text(message["data"]))
        except (RedisError, OSError) as exc:
            log.warning("subscription.lost", channel=channel, error=str(exc) or type(exc).__name__)
            await asyncio.sleep(delay)
            delay = min(delay * 2, _RESUBSCRIBE_MAX_SECONDS)
        finally:
            with contextlib.suppress(RedisError, OSError):
                await pubsub.aclose()


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)
