"""Figure 26: what one API process pays per open stream with a thousand open (issue 44).

One stack of its own (Redis, the API; no worker: the runs stay queued). ``streams`` clients each
subscribe to a queued run of its own (figure 6's streams, bench/streams.py ``api_streams``), one
probe event is written to every run at once, and the figure is: how many streams relayed it
within 30 s, when each had it (p50, p95, the last), the API process's RSS and PSS idle and with
the streams open (per stream), and the Redis connections the API process holds then (``CLIENT
LIST`` by its client name), those in a blocking ``XREAD`` among them. Streams that miss the probe
are counted, not a failure: that count is the figure (the smoke run, ``--quick``, fails on them).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import redis as redis_sync
from redis.asyncio import Redis

from bench.memory import pss_bytes
from bench.stack import running_stack
from bench.streams import END_WAIT_SECONDS, ApiStreams, api_streams

FULL_STREAMS = 1000
QUICK_STREAMS = 20


@dataclass
class OpenStreams:
    streams: int
    measured: ApiStreams | None = None
    pss_idle: int = 0
    pss_open: int = 0
    #: the API process's Redis connections with the streams open, and those blocked in XREAD
    connections: int = 0
    reading: int = 0
    command: str = ""
    code: str = ""
    date: str = ""
    load: str = ""
    elapsed_s: float = 0.0
    fanout_ms: list[float] = field(default_factory=list)


def _connections(url: str, pid: int) -> tuple[int, int]:
    client = redis_sync.Redis.from_url(url, decode_responses=True)
    try:
        clients = cast(list[dict[str, str]], client.client_list())
        mine = [c for c in clients if c.get("name") == f"sophos-api-{pid}"]
    finally:
        client.close()
    return len(mine), sum(1 for c in mine if c.get("cmd") == "xread")


def measure(
    *, streams: int, strict: bool = False, keep: bool = False, say: Callable[[str], None] = lambda _: None
) -> OpenStreams:
    """``strict`` (the smoke run): a stream that misses the probe or its end fails the figure."""
    started = time.monotonic()
    result = OpenStreams(streams=streams)
    with running_stack(keep=keep) as stack:
        api = stack.start_api()
        time.sleep(2.0)  # started and idle
        result.pss_idle = pss_bytes(api.pid)

        def at_open() -> None:
            result.pss_open = pss_bytes(api.pid)
            result.connections, result.reading = _connections(stack.redis.url, api.pid)

        say(f"figure 26: {streams} open streams on one API process")

        async def run() -> ApiStreams:
            redis = Redis.from_url(stack.redis.url)
            try:
                return await api_streams(stack.api_url, api.pid, redis, streams, at_open, require_all=strict)
            finally:
                await redis.aclose()

        result.measured = asyncio.run(run())
        result.fanout_ms = sorted(result.measured.fanout_ms)
    result.elapsed_s = time.monotonic() - started
    return result


HEADING = "## Open streams on one API process (figure 26)"


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def section(o: OpenStreams) -> str:
    m = o.measured
    assert m is not None
    f = o.fanout_ms
    per_rss = (m.rss_open - m.rss_idle) / m.streams / 1024
    per_pss = (o.pss_open - o.pss_idle) / m.streams / 1024
    p50 = statistics.median(f) if f else float("nan")
    return (
        f"{HEADING}\n\n"
        f"One stack of its own (Redis, the API, no worker: the runs stay queued); {m.streams:,} clients each "
        f"on a queued run's `GET /api/chat`, then one event written to every run at once (one pipeline). "
        f"Streams that did not relay it within {END_WAIT_SECONDS:.0f} s are counted, not a failure. "
        f"Took {o.elapsed_s:.0f} s.\n\n"
        f"Measured by `{o.command}` on {o.date} (code {o.code}; load average at start, at end: {o.load}).\n\n"
        f"**{m.probed:,} of {m.streams:,} streams relayed the probe event within {END_WAIT_SECONDS:.0f} s** "
        f"({len(f):,} at all: p50 {p50:,.0f} ms, p95 {_pct(f, 0.95):,.0f} ms, the last "
        f"{f[-1] if f else float('nan'):,.0f} ms after its XADD); "
        f"{m.ended:,} ended with their `end` event. Opened in {m.open_seconds:.1f} s. The API process: "
        f"RSS {m.rss_idle / 2**20:.0f} → {m.rss_open / 2**20:.0f} MB ({per_rss:.1f} KB per stream), PSS "
        f"{o.pss_idle / 2**20:.0f} → {o.pss_open / 2**20:.0f} MB ({per_pss:.1f} KB per stream), "
        f"{m.rss_closed / 2**20:.0f} MB RSS after they ended; its CPU from the XADD until the last "
        f"client had it {m.fanout_cpu_s * 1000:,.0f} ms; Redis connections it held with them open: "
        f"{o.connections:,}, {o.reading:,} of them in a blocking `XREAD`.\n"
    )
