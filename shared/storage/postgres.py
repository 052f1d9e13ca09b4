"""The PostgreSQL side (``DATABASE_URL=postgresql://…``): pools, migrations, the fenced saver.

Any number of workers on any hosts write the same database, each run owned by the worker
holding its lease (``runs.lease_owner`` / ``runs.lease_expires``, worker/run/lifetime/leases.py). What
makes that safe is here:

- **Migrations** run under an advisory lock, so workers starting together apply each one
  once; LangGraph's own ``setup()`` runs under the same lock.
- **The saver** is LangGraph's ``AsyncPostgresSaver`` on a pool, with two changes (which is
  why langgraph-checkpoint-postgres is pinned exactly): its per-instance ``asyncio.Lock``,
  taken around every query even with a pool (langgraph#7259: about six times lower throughput), is
  a semaphore of the pool's size; and each write (a checkpoint, a task's writes) runs in a
  transaction that first checks the writing run's lease, row-locked (``FOR SHARE``). A
  worker that lost its lease (paused past it, then continued) gets :class:`LeaseLost` and
  writes nothing: the check and the write commit together or not at all, and a worker
  taking the run over waits for a write in flight to commit first, or for the server to end
  a transaction its worker left idle longer than a lease (paused mid-write: :func:`open_pool`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import structlog
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.serde.base import SerializerProtocol
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool

from shared.compat import PostgresWriteCursor, postgres_saver_connection
from shared.storage import Dialect, Tx
from shared.storage.leases import CURRENT_LEASE, LeaseLost
from shared.storage.schema import MIGRATIONS

log = structlog.get_logger(__name__)

#: the advisory lock key workers take while migrating ("sophos" in ASCII)
MIGRATION_LOCK = 0x736F70686F73

@functools.lru_cache(maxsize=512)
def to_pg(sql: str) -> str:
    """The application's portable SQL (``?`` parameters) in psycopg's style (``%s``)."""
    return sql.replace("%", "%%").replace("?", "%s")


async def open_pool(
    url: str, *, max_size: int, dict_rows: bool = False, wait: float = 30.0,
    idle_in_transaction: float | None = None,
) -> AsyncConnectionPool:
    """A pool of autocommit connections; waits up to ``wait`` seconds for the first one.

    ``idle_in_transaction``: seconds after which the server ends a session left idle inside a
    transaction (a worker's pools pass its lease). A worker paused or frozen between a write and
    its commit holds that write's row locks; a run's lease row is one of them, and the worker
    taking the lapsed run over would wait on it for as long as the pause lasts. The paused worker
    has lost its lease by then anyway, so nothing it could still commit is wanted.
    """
    kwargs: dict[str, Any] = {"autocommit": True, "prepare_threshold": None}
    if dict_rows:
        # What the saver's queries need (it reads rows by column name).
        kwargs.update(prepare_threshold=0, row_factory=dict_row)
    configure = None
    if idle_in_transaction is not None:
        timeout_ms = max(1, round(idle_in_transaction * 1000))

        async def configure(conn: psycopg.AsyncConnection[Any]) -> None:
            await conn.execute(f"SET idle_in_transaction_session_timeout = {timeout_ms}")

    pool: AsyncConnectionPool = AsyncConnectionPool(
        url, min_size=1, max_size=max_size, kwargs=kwargs, open=False, timeout=wait,
        configure=configure,
    )
    await pool.open(wait=True, timeout=wait)
    return pool


class _PostgresTx:
    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        cursor = await self.conn.execute(to_pg(sql), params)
        return cursor.rowcount

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        cursor = await self.conn.execute(to_pg(sql), params)
        return [tuple(r) for r in await cursor.fetchall()]


class PostgresDatabase:
    """The application tables on a pool: each read and each transaction on a connection of its own."""

    dialect: Dialect = "postgresql"
    leases = True

    def __init__(self, pool: AsyncConnectionPool) -> None:
        self.pool = pool

    @classmethod
    async def open(
        cls, url: str, *, max_size: int = 4, idle_in_transaction: float | None = None
    ) -> PostgresDatabase:
        return cls(await open_pool(url, max_size=max_size, idle_in_transaction=idle_in_transaction))

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Tx]:
        async with self.pool.connection() as conn, conn.transaction():
            yield _PostgresTx(conn)

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        async with self.pool.connection() as conn:
            cursor = await conn.execute(to_pg(sql), params)
            return [tuple(r) for r in await cursor.fetchall()]

    async def close(self) -> None:
        await self.pool.close()


async def schema_version(conn: psycopg.AsyncConnection[Any]) -> int | None:
    """How many migrations the database has (None: no Sophos tables at all)."""
    cursor = await conn.execute("SELECT to_regclass('sophos_schema') IS NOT NULL")
    exists = await cursor.fetchone()
    if not exists or not exists[0]:
        return None
    cursor = await conn.execute("SELECT version FROM sophos_schema")
    row = await cursor.fetchone()
    return int(row[0]) if row else 0


async def migrate(url: str, also: Callable[[], Awaitable[None]] | None = None) -> int:
    """Apply the migrations not yet recorded, then ``also`` (the saver's setup), under one advisory lock."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))
        try:
            version = await schema_version(conn)
            if version is None:
                await conn.execute("CREATE TABLE sophos_schema (version INTEGER NOT NULL)")
                await conn.execute("INSERT INTO sophos_schema VALUES (0)")
                version = 0
            for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
                async with conn.transaction():
                    await conn.execute(script.encode())  # several statements: the simple protocol
                    await conn.execute("UPDATE sophos_schema SET version = %s", (number,))
                log.info("database.migrated", version=number)
            if also is not None:
                await also()
        finally:
            await conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))
    return len(MIGRATIONS)


# --- leases and the fenced saver ----------------------------------------------------


#: the lease is this worker's and has not lapsed; held (FOR SHARE) until the write commits
LEASE_HELD_SQL = (
    "SELECT 1 FROM runs WHERE id = %s AND lease_owner = %s AND status = 'running'"
    " AND lease_expires > extract(epoch from clock_timestamp()) FOR SHARE"
)


class FencedPostgresSaver(PostgresWriteCursor, AsyncPostgresSaver):
    """``AsyncPostgresSaver`` whose writes check the running run's lease in their own transaction."""

    def __init__(
        self, pool: AsyncConnectionPool, *, size: int, serde: SerializerProtocol | None = None
    ) -> None:
        super().__init__(pool, serde=serde)  # type: ignore[arg-type]  # its rows are dicts (open_pool)
        self.size = size
        # langgraph#7259: the pool does the limiting; one lock would serialise every run.
        self.lock = asyncio.Semaphore(size)  # type: ignore[assignment]

    @asynccontextmanager
    async def write_cursor(self) -> AsyncIterator[psycopg.AsyncCursor[DictRow]]:
        """The cursor of a checkpoint's or a task's writes, in a transaction that checks the lease."""
        lease = CURRENT_LEASE.get()
        async with (
            self.lock,
            postgres_saver_connection(self.conn) as conn,
            conn.transaction(),
            conn.cursor(binary=True, row_factory=dict_row) as cur,
        ):
            if lease is not None:
                await cur.execute(LEASE_HELD_SQL, (lease.run_id, lease.owner))
                if await cur.fetchone() is None:
                    raise LeaseLost(lease.run_id)
            yield cur
