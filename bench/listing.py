"""``python -m bench.listing``: a long thread's checkpoints listed, as the export lists them.

Not a figure of the run: an in-process side by side for figure 24's reading of the export
(bench/RESULTS.md). One thread of :func:`bench.bigstore.template` per length, written through
LangGraph's saver into a fresh SQLite file and a fresh PostgreSQL database (the machine's server,
when one answers), then listed whole, each way in turn, medians of three: on SQLite with the
reader's serializer (a stored full copy of the messages decoded only when read) and with the
strict eager one; on PostgreSQL by the reader's listing (shared/storage/threads/listing.py: a
copy fetched only when read) and by LangGraph's saver with each serializer. On PostgreSQL the
JSON Lines export's lines (from the writes, ``api.chat.branches.lines``) are read on the
reader's listing and on the saver's too, and must be the same bytes.
"""

from __future__ import annotations

import asyncio
import functools
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from bench.bigstore import _thread, template
from shared.storage.threads.branch import thread_at
from shared.storage.threads.decoding import DecodedOnce, DecodingSerializer
from tests.support.postgres import PostgresServer

TURNS = (200, 500, 1000)
ROUNDS = 3
SERIALIZERS: dict[str, Callable[[], Any]] = {
    "decoded when read": DecodedOnce,
    "eager": lambda: DecodingSerializer(allowed_msgpack_modules=None),
}


def _side_by_side(
    engine: str, turns: int, ways: Mapping[str, Callable[[], int]], unit: str = "checkpoint"
) -> dict[str, int]:
    """Each way in turn, :data:`ROUNDS` times; print the medians, the first against the second.
    Returns how many of ``unit`` each way read (the same, or the comparison is void)."""
    times: dict[str, list[float]] = {name: [] for name in ways}
    counts: dict[str, int] = {}
    for _ in range(ROUNDS):
        for name, way in ways.items():
            started = time.perf_counter()
            counts[name] = way()
            times[name].append(time.perf_counter() - started)
    medians = {name: statistics.median(t) * 1000 for name, t in times.items()}
    first, second = list(medians.values())[:2]
    shown = ", ".join(f"{name} {ms:,.0f} ms" for name, ms in medians.items())
    listed = max(counts.values())
    each = first * 1000 / max(listed, 1)
    print(f"{engine}: {turns} turns, {listed:,} {unit}s: {shown} ({first / second:.2f}×; "
          f"the first {each:,.0f} µs each)", flush=True)
    return counts


def _listed(saver: Any, thread: str) -> int:
    return sum(1 for _ in saver.list(thread_at(thread)))


def _listed_with(kind: Any, conn: Any, serde: Callable[[], Any], thread: str) -> int:
    return _listed(kind(conn, serde=serde()), thread)


async def _write(saver: Any, turns: int, thread: str) -> None:
    await _thread(saver, template(turns), thread, [f"r{i}" for i in range(turns)])


async def _write_sqlite(path: str, turns: int, thread: str) -> None:
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    async with AsyncSqliteSaver.from_conn_string(path) as saver:
        await _write(saver, turns, thread)


async def _write_postgresql(url: str, turns: int, thread: str) -> None:
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    async with AsyncPostgresSaver.from_conn_string(url) as saver:
        await saver.setup()
        await _write(saver, turns, thread)


def sqlite(root: Path, lengths: tuple[int, ...] = TURNS) -> list[dict[str, int]]:
    from langgraph.checkpoint.sqlite import SqliteSaver

    listed = []
    for turns in lengths:
        path, thread = str(root / f"listing-{turns}.db"), f"t{turns}"
        asyncio.run(_write_sqlite(path, turns, thread))
        conn = sqlite3.connect(path, check_same_thread=False)
        try:
            ways = {name: functools.partial(_listed_with, SqliteSaver, conn, make, thread)
                    for name, make in SERIALIZERS.items()}
            listed.append(_side_by_side("sqlite", turns, ways))
        finally:
            conn.close()
    return listed


def postgresql(url: str, lengths: tuple[int, ...] = TURNS) -> list[dict[str, int]]:
    """Per length: the reader's listing against the saver's (each serializer), then the export's
    lines read on each; returns how many checkpoints each way of listing listed."""
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row

    from shared.storage.threads.listing import LazyPostgresSaver

    listed = []
    for turns in lengths:
        thread = f"t{turns}-{uuid.uuid4().hex[:6]}"
        asyncio.run(_write_postgresql(url, turns, thread))
        with psycopg.connect(url, autocommit=True, prepare_threshold=0, row_factory=dict_row) as conn:
            ours = functools.partial(_listed_with, LazyPostgresSaver, conn, DecodedOnce, thread)
            ways = {
                "the reader's listing": ours,
                **{f"the saver's, {name}": functools.partial(_listed_with, PostgresSaver, conn, make, thread)
                   for name, make in SERIALIZERS.items()},
            }
            listed.append(_side_by_side("postgresql", turns, ways))
            lines: dict[str, bytes] = {}
            exports = {
                "on the reader's listing": functools.partial(_export, LazyPostgresSaver, conn, thread, lines),
                "on the saver's": functools.partial(_export, PostgresSaver, conn, thread, lines),
            }
            _side_by_side("postgresql", turns, exports, "export line")
            if len(set(lines.values())) != 1:
                raise AssertionError(f"the export's lines differ between the listings ({turns} turns)")
    return listed


def _export(kind: Any, conn: Any, thread: str, lines: dict[str, bytes]) -> int:
    """The JSON Lines export's lines read from the writes on a saver of ``kind`` (as a reader
    reads them: its serializer); kept in ``lines`` by kind. Returns how many lines."""
    import msgspec

    from api.chat import branches
    from shared.storage.threads.snapshot import ThreadStates

    found = branches.lines(False, ThreadStates(kind(conn, serde=DecodedOnce())), thread_at(thread))[0]
    lines[kind.__name__] = msgspec.json.encode(found)
    return len(found)


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="sophos-listing-") as root:
        sqlite(Path(root))
    server = PostgresServer()
    why = server.unreachable()
    if why is not None:
        print(f"postgresql left out: {why}")
        return 0
    try:
        postgresql(server.create_database())
    finally:
        server.drop_all()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
