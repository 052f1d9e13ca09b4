"""``python -m worker --check``: is this host's worker alive? For health checks and operators.

Reads only ``REDIS_URL``. Each worker's heartbeat names its host (``socket.gethostname()``,
a container's own name under compose), so the check of one container is about the worker
in it, not about another that beats on the same Redis: exit 0 with one line per live worker
of this host; 1 when none is (naming the live workers elsewhere, if any, or when the last
one beat, if ever); 2 when Redis cannot be asked. Heartbeats that name no host (workers
from before they did) count for any host.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time

from redis.asyncio import Redis
from redis.exceptions import RedisError

from shared.redis.liveness import Beat, Liveness, read_liveness
from shared.settings import Settings
from shared.settings_parsing import SettingsError
from shared.storage.schema import iso_from_timestamp

CONNECT_SECONDS = 3.0


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _worker(beat: Beat, now: float) -> str:
    return (
        f"worker alive: pid {beat.pid}, up since {iso_from_timestamp(beat.started_at)} "
        f"({_ago(now - beat.started_at)}), last beat {_ago(now - beat.beat_at)} ago"
        + (f", id {beat.id}" if beat.id is not None else "")
    )


def local(liveness: Liveness, host: str) -> Liveness:
    """The liveness of the workers on ``host``: all of them when no beat names a host."""
    if not any(b.host is not None for b in liveness.workers):
        return liveness
    mine = liveness.on_host(host)
    return Liveness(alive=bool(mine), beat=mine[0] if mine else liveness.beat, workers=mine)


def describe(liveness: Liveness, now: float, everywhere: Liveness | None = None, host: str = "") -> str:
    """One line per live worker of ``liveness``; else why none is alive (``everywhere``: on
    every host, to name the workers alive elsewhere)."""
    beat = liveness.beat
    if liveness.alive:
        if not liveness.workers:
            return "worker alive"
        return "\n".join(_worker(b, now) for b in liveness.workers)
    if everywhere is not None and everywhere.alive:
        elsewhere = ", ".join(f"pid {b.pid} on {b.host}" for b in everywhere.workers)
        return f"no live worker on this host ({host}); alive elsewhere: {elsewhere or 'a worker'}"
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
    host = socket.gethostname()
    here = local(liveness, host)
    line = describe(here, time.time(), liveness, host)
    print(line, file=sys.stdout if here.alive else sys.stderr)
    return 0 if here.alive else 1
