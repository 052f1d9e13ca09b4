"""``python -m bench.listing``: a long thread's checkpoints listed, as the export lists them.

Not a figure of the run: an in-process side by side for figure 24's reading of the export
(bench/RESULTS.md). One thread of :func:`bench.bigstore.template` per length, written through
LangGraph's saver into a fresh SQLite file and a fresh PostgreSQL database (the machine's server,
when one answers), then listed whole with the reader's serializer (a stored full copy of the
messages decoded only when read) and with the strict eager one, alternated, medians of three.
"""

from __future__ import annotations

import asyncio
import functools
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
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


def _side_by_side(engine: str, turns: int, thread: str, saver_with: Callable[[Any], Any]) -> dict[str, int]:
    """List ``thread`` with each serializer in turn, :data:`ROUNDS` times; print the medians.
    Returns how many checkpoints each serializer listed (the same, or the comparison is void)."""
    times: dict[str, list[float]] = {name: [] for name in SERIALIZERS}
    counts: dict[str, int] = {}
    for _ in range(ROUNDS):
        for name, make in SERIALIZERS.items():
            saver = saver_with(make())
            started = time.perf_counter()
            counts[name] = sum(1 for _ in saver.list(thread_at(thread)))
            times[name].append(time.perf_counter() - started)
    medians = {name: statistics.median(t) * 1000 for name, t in times.items()}
    ratio = medians["decoded when read"] / medians["eager"]
    shown = ", ".join(f"{name} {ms:,.0f} ms" for name, ms in medians.items())
    listed = max(counts.values())
    print(f"{engine}: {turns} turns, {listed:,} checkpoints: {shown} ({ratio:.2f}×)", flush=True)
    return counts


def _saver(kind: Any, conn: Any, serde: Any) -> Any:
    return kind(conn, serde=serde)


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
            saver_with = functools.partial(_saver, SqliteSaver, conn)
            listed.append(_side_by_side("sqlite", turns, thread, saver_with))
        finally:
            conn.close()
    return listed


def postgresql(url: str) -> None:
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row

    for turns in TURNS:
        thread = f"t{turns}-{uuid.uuid4().hex[:6]}"
        asyncio.run(_write_postgresql(url, turns, thread))
        with psycopg.connect(url, autocommit=True, prepare_threshold=0, row_factory=dict_row) as conn:
            _side_by_side("postgresql", turns, thread, functools.partial(_saver, PostgresSaver, conn))


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
