"""Figures 8 to 10: what a long conversation costs to read (issue "long conversations").

8.  The Markdown and JSON Lines export of figure 5's conversation (its every stored
    message), each timed end to end through the API, interleaved.
9.  Another stream's relay latency (figure 3's probe) while that export runs in a loop,
    against the same probe idle, interleaved in blocks.
10. A page of ``GET /api/conversations`` at the database's own size and at 100,000
    conversations (rows written beside the stopped worker, as the worker writes them).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sqlite3
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from redis.asyncio import Redis

from bench.client import Client
from bench.streams import Relay, relay

LARGE = 100_000


@dataclass(slots=True)
class Storage:
    messages: int = 0
    markdown_ms: list[float] = field(default_factory=list)
    jsonl_ms: list[float] = field(default_factory=list)
    relay_idle: Relay = field(default_factory=Relay)
    relay_busy: Relay = field(default_factory=Relay)
    exports_during: int = 0
    page_small: int = 0
    page_small_ms: list[float] = field(default_factory=list)
    page_large: int = LARGE
    page_large_ms: list[float] = field(default_factory=list)


async def _timed(http: httpx.AsyncClient, target: str) -> float:
    started = time.perf_counter()
    response = await http.get(target)
    response.raise_for_status()
    return (time.perf_counter() - started) * 1000


async def exports(api_url: str, conversation: str, samples: int, result: Storage) -> None:
    base = f"/api/conversations/{conversation}/export"
    async with httpx.AsyncClient(base_url=api_url, timeout=120, trust_env=False) as http:
        await _timed(http, base)  # the reader process started, the file in the page cache
        for _ in range(samples):
            result.markdown_ms.append(await _timed(http, base))
            result.jsonl_ms.append(await _timed(http, f"{base}?format=jsonl"))


async def relay_beside_exports(
    api_url: str, http: Client, redis: Redis, conversation: str, samples: int, rng: random.Random,
    result: Storage,
) -> None:
    """Figure 9: the relay probe idle, then with the JSONL export looping, in alternating blocks."""
    block = max(5, samples // 4)
    async with httpx.AsyncClient(base_url=api_url, timeout=120, trust_env=False) as client:
        target = f"/api/conversations/{conversation}/export?format=jsonl"
        for _ in range(max(1, samples // block)):
            idle = await relay(http, redis, block, rng, warm=2)
            result.relay_idle.relay_ms.extend(idle.relay_ms)
            stop = asyncio.Event()

            async def loop(stop: asyncio.Event = stop) -> None:
                while not stop.is_set():
                    await _timed(client, target)
                    result.exports_during += 1

            exporting = asyncio.create_task(loop())
            try:
                await asyncio.sleep(0.2)  # an export in flight before the first probe
                busy = await relay(http, redis, block, rng, warm=2)
                result.relay_busy.relay_ms.extend(busy.relay_ms)
            finally:
                stop.set()
                exporting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await exporting


def seed_conversations(database: Path, total: int) -> int:
    """Add conversation rows until the file holds ``total``; return how many it holds."""
    with contextlib.closing(sqlite3.connect(database, timeout=30)) as db:
        have = int(db.execute("SELECT count(*) FROM conversations").fetchone()[0])
        rows = (
            (str(uuid.uuid4()), f"seeded {i}", f"2025-01-01T00:00:00.{i % 1000:03d}Z",
             f"2025-01-01T00:00:00.{i % 1000:03d}Z")
            for i in range(max(0, total - have))
        )
        with db:
            db.executemany(
                "INSERT INTO conversations (id, title, created_at, updated_at, message_count)"
                " VALUES (?, ?, ?, ?, 0)",
                rows,
            )
        return int(db.execute("SELECT count(*) FROM conversations").fetchone()[0])


async def pages(api_url: str, samples: int) -> list[float]:
    """Figure 10: the first page and the page after it (cursor), each timed."""
    times: list[float] = []
    async with httpx.AsyncClient(base_url=api_url, timeout=60, trust_env=False) as http:
        first = (await http.get("/api/conversations", params={"limit": 50})).json()
        cursor = first.get("nextCursor")
        for _ in range(samples):
            times.append(await _timed(http, "/api/conversations?limit=50"))
            if cursor:
                times.append(await _timed(http, f"/api/conversations?limit=50&cursor={cursor}"))
    return times
