"""The worker's writes to the application tables (conversations, runs).

Uses its own connection to the database file, separate from the checkpointer's:
the saver shares its connection's transaction, so mixing both on one connection
would let one side commit the other's half-done work.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiosqlite
import structlog

from shared.contracts import RunJob, RunStatus
from shared.rows import RUN_COLUMNS, RunRow, title_of
from shared.schema import iso_from_timestamp, migrate, now_iso

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


def is_database_unavailable(exc: BaseException) -> bool:
    """True when ``exc`` (or what caused it) says the database cannot be written now.

    Locked past the busy timeout, disk full, I/O errors: ``sqlite3.OperationalError``.
    Constraint violations and the like are bugs, not unavailability.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, sqlite3.OperationalError):
            return True
        current = current.__cause__ or current.__context__
    return False


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


class RunStore:
    def __init__(self, conn: aiosqlite.Connection) -> None:
        self.conn = conn
        # One transaction at a time on the connection: a run's writes and a retried
        # outcome of another run must not end up in each other's commit.
        self._lock = asyncio.Lock()

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[None]:
        async with self._lock:
            try:
                yield
                await self.conn.commit()
            except BaseException:
                await end_failed_transaction(self.conn)
                raise

    @classmethod
    async def open(cls, path: Path) -> RunStore:
        conn = await connect(path)
        await migrate(conn)
        return cls(conn)

    async def close(self) -> None:
        await self.conn.close()

    async def get_run(self, run_id: str) -> RunRow | None:
        async with self.conn.execute(
            f"SELECT {RUN_COLUMNS} FROM runs WHERE id = ?", (run_id,)
        ) as cur:
            row = await cur.fetchone()
        return RunRow.from_row(row) if row else None

    async def running_runs(self) -> list[RunRow]:
        async with self.conn.execute(
            f"SELECT {RUN_COLUMNS} FROM runs WHERE status = ?", (RunStatus.RUNNING,)
        ) as cur:
            rows = await cur.fetchall()
        return [RunRow.from_row(r) for r in rows]

    async def start_run(self, job: RunJob) -> RunRow | None:
        """Record the run ``running`` (and its conversation, if new) in one transaction.

        Returns None, or the run's row if it was recorded before (arq delivered the
        job twice): then nothing is written. One transaction either way, so a first
        delivery (every run) pays for no separate look-up.
        """
        now = now_iso()
        try:
            async with self._transaction():
                await self.conn.execute(
                    "INSERT INTO conversations (id, title, created_at, updated_at, last_run_id)"
                    " VALUES (?, ?, ?, ?, ?)"
                    " ON CONFLICT(id) DO UPDATE SET updated_at = excluded.updated_at,"
                    " last_run_id = excluded.last_run_id",
                    # created_at: when its first run was accepted, the key the API listed it
                    # by while it was queued; unchanged from then on (stable paging).
                    (job.conversation_id, title_of(job.message), iso_from_timestamp(job.enqueued_at), now,
                     job.run_id),
                )
                cursor = await self.conn.execute(
                    "INSERT INTO runs (id, conversation_id, kind, status, enqueued_at, started_at)"
                    " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO NOTHING",
                    (job.run_id, job.conversation_id, job.kind.value, RunStatus.RUNNING,
                     iso_from_timestamp(job.enqueued_at), now),
                )
                if cursor.rowcount == 0:
                    raise _AlreadyRecorded  # rolls back the conversation's update
        except _AlreadyRecorded:
            return await self.get_run(job.run_id)
        return None

    async def finish_run(
        self,
        run_id: str,
        conversation_id: str,
        *,
        status: RunStatus,
        error_code: str | None = None,
        error_message: str | None = None,
        message_count: int | None = None,
        pending_tasks: bool | None = None,
        step_count: int | None = None,
    ) -> None:
        """Record a run's outcome and its conversation's new shape in one transaction."""
        now = now_iso()
        async with self._transaction():
            await self.conn.execute(
                "UPDATE runs SET status = ?, error_code = ?, error_message = ?, finished_at = ?,"
                " step_count = COALESCE(?, step_count) WHERE id = ?",
                (status, error_code, error_message, now, step_count, run_id),
            )
            await self.conn.execute(
                "UPDATE conversations SET updated_at = ?,"
                " message_count = COALESCE(?, message_count),"
                " pending_tasks = COALESCE(?, pending_tasks) WHERE id = ?",
                (now, message_count, None if pending_tasks is None else int(pending_tasks), conversation_id),
            )


    async def delete_conversation(self, conversation_id: str) -> list[str]:
        """Delete the conversation's row and its runs' in one transaction; return those runs' ids."""
        async with self._transaction():
            async with self.conn.execute(
                "SELECT id FROM runs WHERE conversation_id = ?", (conversation_id,)
            ) as cur:
                run_ids = [str(row[0]) for row in await cur.fetchall()]
            await self.conn.execute("DELETE FROM runs WHERE conversation_id = ?", (conversation_id,))
            await self.conn.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))
        return run_ids


class _AlreadyRecorded(Exception):
    pass
