"""Which workers are alive, and since when? Read from the heartbeat keys the workers write.

Every 2 s each worker writes its beat ``{id, host, pid, started_at, beat_at, ...}`` to a
key of its own (``worker_heartbeat_key(id)``, expiring 10 s after the last write), names
itself in ``WORKERS`` (a sorted set trimmed at each beat), and rewrites the aggregate
``WORKER_HEARTBEAT`` (same TTL, the last writer's beat) and ``WORKER_LAST_BEAT`` (never
expires). A worker is alive while its own key exists; the last beat tells how long ago one
beat once none is alive. An aggregate whose beat names no id is a worker from before the
per-worker keys, and counts as one. Both ends use this module: the API (readyz,
/api/runs, /metrics) and ``python -m worker --check``.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from shared.redis.keys import WORKER_HEARTBEAT, WORKER_LAST_BEAT, WORKERS, worker_heartbeat_key


def connection_name(worker_id: str) -> str:
    """The name (``CLIENT SETNAME``) of the Redis connection a worker beats on: Redis drops it
    the moment the worker's process dies, whatever the heartbeat's TTL still says."""
    return f"sophos-worker:{worker_id}"


def new_worker_id() -> str:
    """``host:pid:random``: names one worker process for its life (its heartbeat, its leases)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True, slots=True)
class Beat:
    pid: int | None
    started_at: float
    beat_at: float
    #: runs the worker executes at once (WORKER_CONCURRENCY); None from a worker that did not say
    concurrency: int | None = None
    #: the worker's id and host (socket.gethostname()); None from a worker that did not say
    id: str | None = None
    host: str | None = None
    #: each MCP server of the worker: "up", or why it is not
    tool_servers: Mapping[str, str] = field(default_factory=dict)
    #: run outcomes the database refused, kept by the worker for a retry (0 from a worker that did not say)
    deferred_outcomes: int = 0
    #: the model it asks (OLLAMA_MODEL) and the tools the agent has now (``server__tool``, what it
    #: does); None and () from a worker that did not say
    model: str | None = None
    tools: tuple[ToolInfo, ...] = ()
    #: the name of the connection it beats on (:func:`connection_name`); None from a worker that
    #: did not say
    connection: str | None = None


@dataclass(frozen=True, slots=True)
class ToolInfo:
    name: str
    description: str


@dataclass(frozen=True, slots=True)
class Liveness:
    alive: bool
    #: the newest live worker's beat, else the last beat ever seen (None: no worker ever beat)
    beat: Beat | None
    #: every live worker's beat, newest first
    workers: tuple[Beat, ...] = ()

    @property
    def count(self) -> int:
        """Live workers (a live heartbeat that could not be read still counts as one)."""
        return len(self.workers) or int(self.alive)

    def age(self, now: float | None = None) -> float | None:
        """Seconds since the last beat."""
        if self.beat is None:
            return None
        return max(0.0, (time.time() if now is None else now) - self.beat.beat_at)

    def on_host(self, host: str) -> tuple[Beat, ...]:
        """The live workers that run on ``host``."""
        return tuple(b for b in self.workers if b.host == host)


def parse_beat(raw: str | bytes | None) -> Beat | None:
    if raw is None:
        return None
    try:
        body = json.loads(raw)
        pid = body.get("pid")
        concurrency = body.get("concurrency")
        worker_id, host, servers = body.get("id"), body.get("host"), body.get("mcp")
        deferred = body.get("deferred")
        model, tools, connection = body.get("model"), body.get("tools"), body.get("connection")
        return Beat(
            pid=int(pid) if pid is not None else None,
            started_at=float(body["started_at"]),
            beat_at=float(body["beat_at"]),
            concurrency=int(concurrency) if concurrency is not None else None,
            id=str(worker_id) if worker_id is not None else None,
            host=str(host) if host is not None else None,
            tool_servers={str(k): str(v) for k, v in servers.items()} if isinstance(servers, dict) else {},
            deferred_outcomes=int(deferred) if deferred is not None else 0,
            model=str(model) if model is not None else None,
            tools=tuple(
                ToolInfo(str(t["name"]), str(t.get("description") or ""))
                for t in (tools if isinstance(tools, list) else ()) if isinstance(t, dict)
            ),
            connection=str(connection) if connection is not None else None,
        )
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


async def read_liveness(redis: Redis) -> Liveness:
    """Raises redis errors as they are."""
    # Every member, not only the recent ones by our clock: a member's own key (its TTL)
    # is what says it is alive, and the set is trimmed at each beat.
    members = [m.decode() if isinstance(m, bytes) else str(m) for m in await redis.zrange(WORKERS, 0, -1)]
    aggregate, last, *own = await redis.mget(
        WORKER_HEARTBEAT, WORKER_LAST_BEAT, *(worker_heartbeat_key(m) for m in members)
    )
    workers = await _connected([beat for raw in own if (beat := parse_beat(raw)) is not None], redis)
    legacy = parse_beat(aggregate)
    if legacy is not None and legacy.id is None:
        workers.append(legacy)  # a worker from before per-worker heartbeats
    workers.sort(key=lambda b: b.beat_at, reverse=True)
    if workers:
        return Liveness(alive=True, beat=workers[0], workers=tuple(workers))
    if aggregate is not None and legacy is None:
        # A heartbeat we cannot parse is still a heartbeat.
        return Liveness(alive=True, beat=parse_beat(last))
    return Liveness(alive=False, beat=parse_beat(last))


async def _connected(workers: list[Beat], redis: Redis) -> list[Beat]:
    """``workers`` less those whose beating connection Redis no longer has: a worker whose process
    died (``kill -9``, a crash: the kernel closes its sockets) is gone at once, not when its
    heartbeat expires (10 s). A worker paused, cut off from Redis or on a host that lost power
    leaves its connection open to Redis, and is gone when its heartbeat expires. Where
    ``CLIENT LIST`` is refused (an ACL, a managed Redis), the beats alone say."""
    if not any(beat.connection for beat in workers):
        return workers
    try:
        clients = await redis.client_list(_type="normal")
    except ResponseError:
        return workers
    names = {str(client.get("name") or "") for client in clients}
    return [beat for beat in workers if beat.connection is None or beat.connection in names]
