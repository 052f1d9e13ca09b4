"""``python -m worker --check``: is a worker alive? For health checks and operators.

Reads only ``REDIS_URL``. Exit 0 with one line when a worker's heartbeat is
there; 1 when none is (saying when the last one beat, if ever); 2 when Redis
cannot be asked.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

from redis.asyncio import Redis
from redis.exceptions import RedisError

from shared.liveness import Liveness, read_liveness
from shared.schema import iso_from_timestamp
from shared.settings import Settings, SettingsError

CONNECT_SECONDS = 3.0


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def describe(liveness: Liveness, now: float) -> str:
    beat = liveness.beat
    if liveness.alive:
        if beat is None:
            return "worker alive"
        return (
            f"worker alive: pid {beat.pid}, up since {iso_from_timestamp(beat.started_at)} "
            f"({_ago(now - beat.started_at)}), last beat {_ago(now - beat.beat_at)} ago"
        )
    if beat is None:
        return "no live worker (none has ever beaten on this Redis)"
    return f"no live worker: the last heartbeat (pid {beat.pid}) was {_ago(now - beat.beat_at)} ago"


async def _read(url: str) -> Liveness:
    redis = Redis.from_url(url, socket_connect_timeout=CONNECT_SECONDS, socket_timeout=CONNECT_SECONDS)
    try:
        return await read_liveness(redis)
    finally:
        await redis.aclose()


def check() -> int:
    try:
        url = Settings.from_env({"REDIS_URL": os.environ.get("REDIS_URL", "")}).redis_url
    except SettingsError as exc:
        print(f"sophos-worker: {exc}", file=sys.stderr)
        return 2
    try:
        liveness = asyncio.run(_read(url))
    except (RedisError, OSError) as exc:
        print(f"sophos-worker: cannot reach Redis: {exc}", file=sys.stderr)
        return 2
    line = describe(liveness, time.time())
    print(line, file=sys.stdout if liveness.alive else sys.stderr)
    return 0 if liveness.alive else 1
