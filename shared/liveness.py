"""Is a worker alive, and since when? Read from the heartbeat keys the worker writes.

The worker writes ``{pid, started_at, beat_at}`` every 2 s to ``WORKER_HEARTBEAT``
(expires 10 s after the last write) and to ``WORKER_LAST_BEAT`` (never expires).
A worker is alive while the first exists; the second tells how long ago the last
one beat once none is alive. Both ends use this module: the API (readyz,
/api/runs, /metrics) and ``python -m worker --check``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from redis.asyncio import Redis

from shared.contracts import WORKER_HEARTBEAT, WORKER_LAST_BEAT


@dataclass(frozen=True, slots=True)
class Beat:
    pid: int | None
    started_at: float
    beat_at: float
    #: runs the worker executes at once (WORKER_CONCURRENCY); None from a worker that did not say
    concurrency: int | None = None


@dataclass(frozen=True, slots=True)
class Liveness:
    alive: bool
    #: the live worker's beat, else the last beat ever seen (None: no worker ever beat)
    beat: Beat | None

    def age(self, now: float | None = None) -> float | None:
        """Seconds since the last beat."""
        if self.beat is None:
            return None
        return max(0.0, (time.time() if now is None else now) - self.beat.beat_at)


def parse_beat(raw: str | bytes | None) -> Beat | None:
    if raw is None:
        return None
    try:
        body = json.loads(raw)
        pid = body.get("pid")
        concurrency = body.get("concurrency")
        return Beat(
            pid=int(pid) if pid is not None else None,
            started_at=float(body["started_at"]),
            beat_at=float(body["beat_at"]),
            concurrency=int(concurrency) if concurrency is not None else None,
        )
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


async def read_liveness(redis: Redis) -> Liveness:
    """Raises redis errors as they are."""
    live, last = await redis.mget(WORKER_HEARTBEAT, WORKER_LAST_BEAT)
    beat = parse_beat(live)
    if live is not None:
        # A heartbeat we cannot parse is still a heartbeat.
        return Liveness(alive=True, beat=beat or parse_beat(last))
    return Liveness(alive=False, beat=parse_beat(last))
