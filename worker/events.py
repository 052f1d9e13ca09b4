"""Publishing a run's events to its Redis Stream.

Each event gets the next id of the run (1, 2, 3, ...) here, where it is
produced, and is stored as stream entry ``<id>-0``: every API process reads the
same ids, so ``Last-Event-ID`` means the same thing everywhere.

Events are the view, the checkpoint is the truth: a failed publish is logged
and dropped, never allowed to fail the run.
"""

from __future__ import annotations

from typing import Any

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

from shared.contracts import EventType, dumps, events_key

log = structlog.get_logger(__name__)

# While a run is live its stream must outlast any pause between events.
_LIVE_TTL_SECONDS = 24 * 3600


class EventPublisher:
    def __init__(self, redis: Redis, run_id: str, *, retention: int, max_len: int) -> None:
        self.redis = redis
        self.run_id = run_id
        self.key = events_key(run_id)
        self.retention = retention
        self.max_len = max_len
        self.next_id = 1
        self.failures = 0

    async def start(self) -> None:
        """Continue after the entries already in the stream (a re-delivered job)."""
        try:
            last = await self.redis.xrevrange(self.key, count=1)
        except RedisError as exc:
            log.warning("events.read_failed", error=str(exc))
            return
        if last:
            entry_id = last[0][0]
            entry_id = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
            self.next_id = int(entry_id.split("-")[0]) + 1

    async def publish(self, type_: EventType, data: Any) -> int | None:
        event_id = self.next_id
        self.next_id += 1
        ttl = self.retention if type_.terminal else max(self.retention, _LIVE_TTL_SECONDS)
        try:
            # One round trip: XADD and the expiry travel in one pipeline.
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.xadd(
                    self.key,
                    {"type": type_.value, "data": dumps(data)},
                    id=f"{event_id}-0",
                    maxlen=self.max_len,
                    approximate=True,
                )
                pipe.expire(self.key, ttl)
                await pipe.execute()
        except RedisError as exc:
            self.failures += 1
            log.warning("events.publish_failed", event_type=type_.value, event_id=event_id, error=str(exc))
            return None
        return event_id

    async def token(self, text: str) -> None:
        await self.publish(EventType.TOKEN, text)

    async def trace(self, step: int, node: str, event: str, name: str, data: Any = None) -> None:
        body: dict[str, Any] = {"step": step, "node": node, "event": event, "name": name}
        if data is not None:
            body["data"] = data
        await self.publish(EventType.TRACE, body)
