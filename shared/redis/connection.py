"""Redis connections that outlive a Redis restart.

redis-py 5 does not retry by default: after a restart the first command on
each pooled connection fails with "Connection closed by server". Both
processes retry connection errors with capped exponential backoff, so a Redis
restart of up to ~30 s is ridden out without restarting the worker or the API.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

RETRY_ON = [RedisConnectionError, RedisTimeoutError, ConnectionResetError]


def retry_policy(attempts: int = 20) -> Retry:
    return Retry(ExponentialBackoff(cap=2.0, base=0.05), attempts)


def connection_kwargs() -> dict[str, Any]:
    """Keyword arguments for ``Redis.from_url`` / ``ConnectionPool.from_url``."""
    return {
        "retry": retry_policy(),
        "retry_on_error": RETRY_ON,
        "health_check_interval": 30,
        "socket_keepalive": True,
    }
