"""The SQLite side: one file, one writer connection (the worker's), WAL so the API reads beside it."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiosqlite
import structlog

from shared.storage import Dialect, Tx
from shared.storage.schema import MIGRATIONS

log = structlog.get_logger(__name__)


async def connect(path: Path) -> aiosqlite.Connection:
    """Open the database for writing, in WAL mode so the API can read beside us."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = await aiosqlite.connect(path, timeout=5.0)
    await conn.execute("PRAGMA journal_mode=WAL")
    await conn.execute("PRAGMA synchronous=FULL")
    await conn.execute("PRAGMA foreign_keys=ON")
    await conn.execute("PRAGMA busy_timeout=5000")
    return conn


async def migrate(conn: aiosqlite.Connection) -> int:
    """Apply the migrations not yet recorded (``PRAGMA user_version``); return the resulting version."""
    async with conn.execute("PRAGMA user_version") as cur:
        row = await cur.fetchone()
    version = int(row[0]) if row else 0
    for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
        # executescript commits first; the version bump is part of the script so a
        # crash leaves either the old or the new version, never a half-applied one.
        await conn.executescript(f"BEGIN;\n{script}\nPRAGMA user_version = {number};\nCOMMIT;")
    return len(MIGRATIONS)


async def end_failed_transaction(conn: aiosqlite.Connection) -> None:
    """Roll back what a failed write left open on ``conn``.

    A write that fails (busy, disk full) can leave the connection inside a
    transaction holding an old snapshot; every later write on it would then fail
    too, long after the database is writable again.
    """
    try:
        if conn.in_transaction:
            await conn.rollback()
    except sqlite3.Error as exc:
        log.warning("database.rollback_failed", error=str(exc))


async def _fetchall(conn: aiosqlite.Connection, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    # One trip to the connection's thread (a cursor's execute, fetchall and close would be three).
    return [tuple(r) for r in await conn.execute_fetchall(sql, params)]


class _SqliteTx:
    def __init__(self, conn: aiosqlite.Connection) -> None:
        self.conn = conn

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        cursor = await self.conn.execute(sql, params)
        return cursor.rowcount

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return await _fetchall(self.conn, sql, params)


class SqliteDatabase:
    """The worker's connection to the file, separate from the checkpointer's.

    The saver shares its connection's transaction, so mixing both on one connection
    would let one side commit the other's half-done work.
    """

    dialect: Dialect = "sqlite"
    leases = False

    def __init__(self, conn: aiosqlite.Connection) -> None:
        self.conn = conn
        # One transaction at a time on the connection: a run's writes and a retried
        # outcome of another run must not end up in each other's commit.
        self._lock = asyncio.Lock()

    @classmethod
    async def open(cls, path: Path) -> SqliteDatabase:
        conn = await connect(path)
        await migrate(conn)
        return cls(conn)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Tx]:
        async with self._lock:
            try:
                yield _SqliteTx(self.conn)
                await self.conn.commit()
            except BaseException:
                await end_failed_transaction(self.conn)
                raise

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return await _fetchall(self.conn, sql, params)

    async def close(self) -> None:
        await self.conn.close()
