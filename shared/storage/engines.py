"""Which engine the settings name, and everything opened on it: the one place that asks.

``DATABASE_URL`` unset: the SQLite file at ``DATABASE_PATH``, one writer (the worker holding
its lock file, worker/lock.py). Set to ``postgresql://…``: any number of workers, each run
under a lease (worker/run/lifetime/leases.py). The rest of the service asks what an engine guarantees
(:func:`single_writer`, ``Database.leases``), never which one it is.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any

import structlog

from shared.settings import Settings
from shared.storage import Database
from shared.storage.reading import PostgresReader, Reader, SqliteReader

if TYPE_CHECKING:  # the API's main process opens a reader here, and never loads LangGraph
    from langgraph.checkpoint.base import BaseCheckpointSaver
    from langgraph.store.base import BaseStore

log = structlog.get_logger(__name__)


def single_writer(settings: Settings) -> bool:
    """True when one worker writes the database (SQLite): it must hold the file's writer lock,
    and every run it finds ``running`` at start-up was left by a worker that is gone."""
    return settings.database_url is None


async def open_database(settings: Settings, *, max_size: int) -> Database:
    """The application tables, for writing: the SQLite file (migrated here), or a pool of at
    most ``max_size`` PostgreSQL connections (migrated with the saver: :func:`open_checkpointer`)
    whose transactions left idle past a lease are ended by the server (shared/storage/postgres.py)."""
    if settings.database_url is not None:
        from shared.storage.postgres import PostgresDatabase

        return await PostgresDatabase.open(
            settings.database_url, max_size=max_size, idle_in_transaction=settings.run_lease_seconds
        )
    from shared.storage.sqlite import SqliteDatabase

    return await SqliteDatabase.open(settings.database_path)


async def open_migrated_database(settings: Settings) -> Database:
    """The application tables, migrated, for a command that writes them with no worker running
    (``sophos users``): one connection, on either engine."""
    if settings.database_url is not None:
        from shared.storage.postgres import migrate

        await migrate(settings.database_url)
    return await open_database(settings, max_size=1)


def open_reader(settings: Settings) -> Reader:
    """The database, read-only, opened on first use (the API's)."""
    if settings.database_url is not None:
        return PostgresReader(settings.database_url, shown=settings.database_name)
    return SqliteReader(settings.database_path)


@asynccontextmanager
async def open_checkpointer(
    settings: Settings, *, size: int, hooks: Sequence[type] = ()
) -> AsyncIterator[BaseCheckpointSaver[Any]]:
    """LangGraph's saver for the engine, set up: SQLite's (each write one hop to its thread:
    shared/storage/sqlite_saver.py) on a connection of its own (it commits
    its own writes and must not share a transaction with the application tables), or
    PostgreSQL's fenced one on a pool of ``size`` (migrating the application tables first, under
    one lock, whoever starts first). ``hooks``: classes mixed in before the saver's own, the
    first outermost: a fault (worker/faults.py), so a test can stop the worker at a chosen
    write on either engine; the timing of writes (worker/metrics.py); their spans
    (shared/tracing.py).
    """
    if settings.database_url is not None:
        from shared.storage.postgres import FencedPostgresSaver, migrate, open_pool

        pool = await open_pool(
            settings.database_url, max_size=size, dict_rows=True,
            idle_in_transaction=settings.run_lease_seconds,
        )
        try:
            cls = _hooked(FencedPostgresSaver, hooks)
            saver = cls(pool, size=size)
            await migrate(settings.database_url, also=saver.setup)
            yield saver
        finally:
            await pool.close()
        return
    from shared.storage.sqlite import connect
    from shared.storage.sqlite_saver import OneHopSaver

    conn = await connect(settings.database_path)
    try:
        sqlite_saver = _hooked(OneHopSaver, hooks)(conn)
        await sqlite_saver.setup()
        yield sqlite_saver
    finally:
        await conn.close()


def _hooked(base: type[Any], hooks: Sequence[type]) -> type[Any]:
    if not hooks:
        return base
    return type("".join(h.__name__ for h in hooks) + base.__name__, (*hooks, base), {})


def open_item_store(settings: Settings, *, size: int = 2) -> AbstractAsyncContextManager[BaseStore]:
    """LangGraph's store of the Store's items for the engine (shared/storage/memory.py): its own
    SQLite file (``STORE_PATH``, else beside the database), or the PostgreSQL database on a pool
    of ``size``."""
    from shared.storage.memory import postgres_item_store, sqlite_item_store, store_path

    if settings.database_url is not None:
        return postgres_item_store(settings.database_url, size=size)
    return sqlite_item_store(settings.store_path or store_path(settings.database_path))
