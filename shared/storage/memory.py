"""The Store's items, long-term memory that outlives a thread, on LangGraph's own ``BaseStore``.

Which store stands behind it is the engine's (:func:`shared.storage.engines.open_item_store`):
LangGraph's ``AsyncSqliteStore`` in a file of its own beside the database (:func:`store_path`),
or its ``AsyncPostgresStore`` on the same database (its tables ``store`` and
``store_migrations``), set up under the migration lock. The SQLite file is not the worker's
database: every process that serves the Store writes it (SQLite's own locking, WAL and a busy
timeout), so a put needs no worker, and the worker's single-writer rule for the database is
untouched.

Namespaces here are the stored ones: whose an item is, is decided before (api/auth/scope.py,
worker/agent/memory.py), never in this module.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from langgraph.store.base import BaseStore


def owner_label(owner: str) -> str:
    """The first label of every namespace of ``owner``'s items: the name in base64url, so no
    ``.`` (which separates labels) and never ``langgraph`` (which LangGraph reserves). Labels
    match whole, so no name reaches into another's (api/auth/scope.py, worker/agent/memory.py)."""
    return "u-" + base64.urlsafe_b64encode(owner.encode()).decode().rstrip("=")


def store_path(database_path: Path) -> Path:
    """The SQLite file of the Store's items, beside the database: ``sophos.db`` → ``sophos.store.db``."""
    return database_path.with_name(f"{database_path.stem}.store{database_path.suffix or '.db'}")


@asynccontextmanager
async def sqlite_item_store(path: Path) -> AsyncIterator[BaseStore]:
    """LangGraph's SQLite store on its own file ``path``, set up, on a connection of its own."""
    import aiosqlite
    from langgraph.store.sqlite.aio import AsyncSqliteStore

    path.parent.mkdir(parents=True, exist_ok=True)
    # Autocommit: the store opens and commits its own transactions (BEGIN … COMMIT).
    conn = await aiosqlite.connect(path, timeout=5.0, isolation_level=None)
    try:
        await conn.execute("PRAGMA journal_mode=WAL")
        await conn.execute("PRAGMA synchronous=FULL")
        await conn.execute("PRAGMA busy_timeout=5000")
        store = AsyncSqliteStore(conn)
        await store.setup()
        yield store
    finally:
        await conn.close()


@asynccontextmanager
async def postgres_item_store(url: str, *, size: int) -> AsyncIterator[BaseStore]:
    """LangGraph's PostgreSQL store on a pool of ``size``, its tables set up under the lock that
    the application's migrations take (two processes starting at once set them up once)."""
    from langgraph.store.postgres.aio import AsyncPostgresStore

    from shared.storage.postgres import migrate, open_pool

    pool = await open_pool(url, max_size=size, dict_rows=True)
    try:
        store = AsyncPostgresStore(cast(Any, pool))  # open_pool's rows are dicts (dict_rows)
        await migrate(url, also=store.setup)
        yield store
    finally:
        await pool.close()


class LazyItemStore:
    """The Store opened on first use and kept for the process's life: the API starts while the
    database is down, and answers 503 for the Store meanwhile (``DatabaseUnavailable``)."""

    def __init__(self, opener: Callable[[], AbstractAsyncContextManager[BaseStore]]) -> None:
        self._opener = opener
        self._stack = AsyncExitStack()
        self._store: BaseStore | None = None
        self._lock = asyncio.Lock()

    async def get(self) -> BaseStore:
        if self._store is not None:
            return self._store
        async with self._lock:
            if self._store is None:
                self._store = await self._stack.enter_async_context(self._opener())
            return self._store

    async def close(self) -> None:
        self._store = None
        await self._stack.aclose()


def unreachable() -> tuple[type[Exception], ...]:
    """What the engines raise when the Store's database cannot be reached or is busy past its
    timeout: answered 503 (``DatabaseUnavailable``), never as the caller's fault."""
    import sqlite3

    import psycopg
    from psycopg_pool import PoolTimeout

    return (sqlite3.OperationalError, psycopg.OperationalError, PoolTimeout, OSError)
