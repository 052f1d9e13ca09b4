"""The database read, never written: the API's side of either engine.

A reader (:class:`SqliteReader`, :class:`PostgresReader`) opens lazily, so the API starts
before any worker has created the database, and answers :meth:`fetchall` with rows or
raises DATABASE_UNAVAILABLE; the next call tries again. Until the workers have migrated,
:meth:`schema_version` says so and there is nothing to read. A thread is read in a process
of its own (api/http/readers.py), on a connection of its own: :class:`ThreadSource` is what that
process is sent (picklable), and its :meth:`ThreadSource.read` opens LangGraph's saver for
the engine and turns the engine's errors into DATABASE_UNAVAILABLE.

Measured facts about read-only connections to a WAL SQLite file, which shape
:class:`SqliteReader`:

- While a writer has the database open, its ``-wal`` and ``-shm`` files exist and a
  ``mode=ro`` connection reads beside it, seeing each commit on its next statement.
- When the worker has stopped (and removed ``-wal``/``-shm`` on a clean close), a
  ``mode=ro`` connection still opens *if the directory is writable for us*: SQLite
  recreates both files itself. If it is not (API running as another user), the
  first read fails with "attempt to write a readonly database". That is reported
  as DATABASE_UNAVAILABLE (readyz: database false) and retried on the next call;
  ``immutable=1`` is deliberately not used, as it would hide the worker's writes.
- A failed connection is retired and another opened on the next call, and so is one
  whose file was replaced (new inode), so a recreated database is picked up. A
  retired connection is closed only once the reads using it are done.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import aiosqlite
import anyio
import structlog

from shared.storage.threads.source import ThreadSource, unavailable

# psycopg is imported where PostgreSQL is read, not here: on SQLite the API is ~9 MB lighter
# without it (bench figure 15). Threads are read in reader processes, through ThreadSource
# (shared/storage/threads/source.py), which do not import this module.
if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool

log = structlog.get_logger(__name__)

T = TypeVar("T")


class Reader(Protocol):
    """The application tables and checkpoints, read-only, opened on first use."""

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Rows of ``sql`` (portable SQL, ``?`` parameters); [] while the database does not exist."""
        ...

    async def schema_version(self) -> int | None:
        """How many migrations the database has had; None while it does not exist."""
        ...

    async def has_checkpoints(self) -> bool:
        """Whether LangGraph's checkpoint tables exist yet (its setup cannot run read-only)."""
        ...

    @property
    def threads(self) -> ThreadSource: ...

    async def close(self) -> None: ...


# --- SQLite ---------------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class _Handle:
    """One opened connection, closed once retired *and* no query uses it."""

    conn: aiosqlite.Connection
    identity: tuple[int, int]
    users: int = 0
    retired: bool = False


#: Python's ``str.casefold`` in SQL on the reader's connections (SQLite's own ``lower`` and
#: ``LIKE`` fold ASCII letters only): the title search of api/conversations/title_search.py.
FOLD_FUNCTION = "sophos_fold"


def _fold(text: object) -> object:
    return text.casefold() if isinstance(text, str) else text


class SqliteReader:
    """The SQLite file, read-only (``mode=ro``); never migrated or written from here.

    Every read leases the current connection (:meth:`_lease`). A connection found
    broken, or replaced because the file was, is retired: new reads open another,
    and the retired one is closed when the last read using it ends, never under a
    read in flight (which would fail with aiosqlite's "Connection closed").
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._handle: _Handle | None = None
        self._lock = asyncio.Lock()

    @property
    def threads(self) -> ThreadSource:
        return ThreadSource("sqlite", f"{self.path.as_uri()}?mode=ro")

    async def close(self) -> None:
        async with self._lock:
            handle, self._handle = self._handle, None
            if handle is not None:
                handle.retired = True
                await _close(handle.conn)

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        async with self._lease() as handle:
            return [] if handle is None else await _rows(handle.conn, sql, params)

    async def schema_version(self) -> int | None:
        async with self._lease() as handle:
            if handle is None:
                return None
            rows = await _rows(handle.conn, "PRAGMA user_version")
        return int(rows[0][0]) if rows else 0

    async def has_checkpoints(self) -> bool:
        rows = await self.fetchall(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN ('checkpoints', 'writes')"
        )
        return bool(rows) and rows[0][0] == 2

    async def _retire(self, handle: _Handle) -> None:
        """Stop handing ``handle`` out; close it now if no read is using it (lock held)."""
        if self._handle is handle:
            self._handle = None
        if not handle.retired:
            handle.retired = True
            if handle.users == 0:
                await _close(handle.conn)

    async def _current(self) -> _Handle | None:
        """The open connection, (re)opened as needed; None while the file does not exist (lock held)."""
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            if self._handle is not None:
                await self._retire(self._handle)
            return None
        identity = (stat.st_dev, stat.st_ino)
        if self._handle is not None:
            if self._handle.identity == identity:
                return self._handle
            await self._retire(self._handle)
        conn: aiosqlite.Connection | None = None
        try:
            conn = await aiosqlite.connect(f"{self.path.as_uri()}?mode=ro", uri=True, timeout=5.0)
            await conn.create_function(FOLD_FUNCTION, 1, _fold, deterministic=True)
            # A first read proves the connection usable (see the module docstring).
            await (await conn.execute("PRAGMA user_version")).close()
        except sqlite3.Error as exc:
            if conn is not None:
                await _close(conn)
            raise unavailable(exc) from exc
        self._handle = _Handle(conn, identity)
        log.info("database.opened", path=str(self.path))
        return self._handle

    @asynccontextmanager
    async def _lease(self) -> AsyncIterator[_Handle | None]:
        """The current connection, kept open until the block ends; None while there is no file.

        A ``sqlite3.Error`` raised in the block retires the connection (the next read
        opens a fresh one) and becomes DATABASE_UNAVAILABLE.
        """
        async with self._lock:
            handle = await self._current()
            if handle is not None:
                handle.users += 1
        if handle is None:
            yield None
            return
        try:
            yield handle
        except sqlite3.Error as exc:
            log.warning("database.read_failed", error=str(exc))
            async with self._lock:
                await self._retire(handle)
            raise unavailable(exc) from exc
        finally:
            # Shielded: a read cancelled by its client must still give the connection back.
            with anyio.CancelScope(shield=True):
                async with self._lock:
                    handle.users -= 1
                    if handle.retired and handle.users == 0:
                        await _close(handle.conn)


async def _rows(conn: aiosqlite.Connection, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    async with conn.execute(sql, params) as cur:
        return [tuple(r) for r in await cur.fetchall()]


async def _close(conn: aiosqlite.Connection) -> None:
    try:
        await conn.close()
    except sqlite3.Error as exc:
        log.warning("database.close_failed", error=str(exc))


# --- PostgreSQL -----------------------------------------------------------------------


class PostgresReader:
    """A PostgreSQL database (``DATABASE_URL``) on a small pool.

    The pool opens lazily and connects in the background, so the API starts before the
    database is reachable; a query that finds no connection within a few seconds, or loses
    one, is DATABASE_UNAVAILABLE, and the next call tries again.
    """

    def __init__(self, url: str, *, shown: str) -> None:
        self.url = url
        #: the database's name without its password, for logs
        self.shown = shown
        self._pool: AsyncConnectionPool | None = None
        self._lock = asyncio.Lock()

    @property
    def threads(self) -> ThreadSource:
        return ThreadSource("postgresql", self.url)

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        import psycopg
        from psycopg_pool import AsyncConnectionPool, PoolTimeout

        from shared.storage.postgres import to_pg

        if self._pool is None:
            async with self._lock:
                if self._pool is None:
                    pool: AsyncConnectionPool = AsyncConnectionPool(
                        self.url, min_size=1, max_size=4, open=False, timeout=5.0,
                        kwargs={"autocommit": True, "prepare_threshold": None},
                    )
                    await pool.open(wait=False)
                    self._pool = pool
                    log.info("database.opened", database=self.shown)
        try:
            async with self._pool.connection() as conn:
                cursor = await conn.execute(to_pg(sql), params)
                return [tuple(r) for r in await cursor.fetchall()]
        except (psycopg.Error, PoolTimeout) as exc:
            log.warning("database.read_failed", error=str(exc))
            raise unavailable(exc) from exc

    async def schema_version(self) -> int | None:
        rows = await self.fetchall("SELECT to_regclass('sophos_schema') IS NOT NULL")
        if not rows or not rows[0][0]:
            return None
        rows = await self.fetchall("SELECT version FROM sophos_schema")
        return int(rows[0][0]) if rows else 0

    async def has_checkpoints(self) -> bool:
        rows = await self.fetchall(
            "SELECT to_regclass('checkpoints') IS NOT NULL AND to_regclass('checkpoint_writes') IS NOT NULL"
        )
        return bool(rows) and bool(rows[0][0])
