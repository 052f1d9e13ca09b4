"""Read-only access to the worker's SQLite file: application tables and checkpoints.

The worker is the single writer; this module opens the file with ``mode=ro`` and
never migrates or writes. The file may not exist yet (no worker has started):
then there is nothing to read, and every call looks again. Measured facts about
read-only connections to a WAL database, which shape the code below:

- While a writer has the database open, its ``-wal`` and ``-shm`` files exist and a
  ``mode=ro`` connection reads beside it, seeing each commit on its next statement.
- When the worker has stopped (and removed ``-wal``/``-shm`` on a clean close), a
  ``mode=ro`` connection still opens *if the directory is writable for us*: SQLite
  recreates both files itself. If it is not (API running as another user), the
  first read fails with "attempt to write a readonly database". That is reported
  as DATABASE_UNAVAILABLE (readyz: database false) and retried on the next call;
  ``immutable=1`` is deliberately not used, as it would hide the worker's writes.
- A failed connection is dropped and reopened on the next call, and so is one whose
  file was replaced (new inode), so a recreated database is picked up.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite
import structlog
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.pregel import Pregel

from shared.errors import ConversationUnreadable, DatabaseUnavailable
from shared.schema import MIGRATIONS
from shared.thread import reader_graph

log = structlog.get_logger(__name__)

T = TypeVar("T")

#: what reads a thread: the agent graph's reader and the thread's config
ThreadRead = Callable[[Pregel[Any, Any, Any, Any], RunnableConfig], T]


@dataclass(frozen=True, slots=True)
class ConversationRow:
    id: str
    title: str
    created_at: str
    updated_at: str
    message_count: int
    pending_tasks: bool
    last_run_id: str | None
    last_status: str | None
    last_error_code: str | None
    last_error_message: str | None


@dataclass(frozen=True, slots=True)
class RunRow:
    id: str
    conversation_id: str
    kind: str
    status: str
    error_code: str | None
    error_message: str | None
    enqueued_at: str | None
    started_at: str | None
    finished_at: str | None
    step_count: int


_CONVERSATION_SQL = """
SELECT c.id, c.title, c.created_at, c.updated_at, c.message_count, c.pending_tasks, c.last_run_id,
       r.status, r.error_code, r.error_message
FROM conversations c LEFT JOIN runs r ON r.id = c.last_run_id
"""
_RUN_SQL = """
SELECT id, conversation_id, kind, status, error_code, error_message, enqueued_at, started_at,
       finished_at, step_count
FROM runs
"""

#: the order of the runs listing (with ``id``): when a run was accepted
_RUN_KEY = "COALESCE(enqueued_at, started_at)"


def _conversation(row: Sequence[Any]) -> ConversationRow:
    return ConversationRow(
        id=row[0], title=row[1], created_at=row[2], updated_at=row[3], message_count=int(row[4] or 0),
        pending_tasks=bool(row[5]), last_run_id=row[6], last_status=row[7], last_error_code=row[8],
        last_error_message=row[9],
    )


def _run(row: Sequence[Any]) -> RunRow:
    return RunRow(
        id=row[0], conversation_id=row[1], kind=row[2], status=row[3], error_code=row[4],
        error_message=row[5], enqueued_at=row[6], started_at=row[7], finished_at=row[8],
        step_count=int(row[9] or 0),
    )


def thread_config(conversation_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": conversation_id, "checkpoint_ns": ""}}


class Store:
    """The API's read-only view of the database file, opened lazily."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._conn: aiosqlite.Connection | None = None
        self._saver: AsyncSqliteSaver | None = None
        self._identity: tuple[int, int] | None = None
        self._schema_ready = False
        self._checkpoints_ready = False
        self._lock = asyncio.Lock()
        self._readers: ProcessPoolExecutor | None = None

    async def close(self) -> None:
        async with self._lock:
            await self._drop()
        if self._readers is not None:
            self._readers.shutdown(wait=False, cancel_futures=True)
            self._readers = None

    # --- connection -------------------------------------------------------------

    async def _drop(self) -> None:
        conn, self._conn, self._saver, self._identity = self._conn, None, None, None
        self._schema_ready = self._checkpoints_ready = False
        if conn is not None:
            try:
                await conn.close()
            except sqlite3.Error as exc:
                log.warning("database.close_failed", error=str(exc))

    async def _connection(self) -> aiosqlite.Connection | None:
        """The open connection, (re)opened as needed; None while the file does not exist."""
        async with self._lock:
            try:
                stat = os.stat(self.path)
            except FileNotFoundError:
                await self._drop()
                return None
            identity = (stat.st_dev, stat.st_ino)
            if self._conn is not None and self._identity == identity:
                return self._conn
            await self._drop()
            conn: aiosqlite.Connection | None = None
            try:
                conn = await aiosqlite.connect(f"{self.path.as_uri()}?mode=ro", uri=True, timeout=5.0)
                # A first read proves the connection usable (see the module docstring).
                await (await conn.execute("PRAGMA user_version")).close()
            except sqlite3.Error as exc:
                if conn is not None:
                    await conn.close()
                raise DatabaseUnavailable(f"the database cannot be read: {exc}") from exc
            self._conn, self._identity = conn, identity
            # Strict deserialization whatever the environment says: the API only
            # needs the message types on the allowlist.
            self._saver = AsyncSqliteSaver(conn, serde=JsonPlusSerializer(allowed_msgpack_modules=None))
            log.info("database.opened", path=str(self.path))
            return conn

    async def _failed(self, conn: aiosqlite.Connection, exc: sqlite3.Error) -> DatabaseUnavailable:
        log.warning("database.read_failed", error=str(exc))
        async with self._lock:
            if self._conn is conn:
                await self._drop()
        return DatabaseUnavailable(f"the database cannot be read: {exc}")

    async def schema_version(self) -> int | None:
        """``PRAGMA user_version`` of the file, or None when it does not exist."""
        conn = await self._connection()
        if conn is None:
            return None
        rows = await self._query(conn, "PRAGMA user_version")
        return int(rows[0][0]) if rows else 0

    async def _tables(self) -> aiosqlite.Connection | None:
        """The connection once the worker has created the application tables."""
        if not self._schema_ready:
            version = await self.schema_version()
            if version is None or version < len(MIGRATIONS):
                return None
            self._schema_ready = True
        return await self._connection()

    async def _query(self, conn: aiosqlite.Connection, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        try:
            async with conn.execute(sql, params) as cur:
                return list(await cur.fetchall())
        except sqlite3.Error as exc:
            raise await self._failed(conn, exc) from exc

    async def _fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        conn = await self._tables()
        return [] if conn is None else await self._query(conn, sql, params)

    # --- application tables -----------------------------------------------------

    async def conversation(self, conversation_id: str) -> ConversationRow | None:
        rows = await self._fetch(f"{_CONVERSATION_SQL} WHERE c.id = ?", (conversation_id,))
        return _conversation(rows[0]) if rows else None

    async def conversations(self) -> list[ConversationRow]:
        rows = await self._fetch(f"{_CONVERSATION_SQL} ORDER BY c.updated_at DESC, c.id")
        return [_conversation(r) for r in rows]

    async def run(self, run_id: str) -> RunRow | None:
        rows = await self._fetch(f"{_RUN_SQL} WHERE id = ?", (run_id,))
        return _run(rows[0]) if rows else None

    async def runs_by_id(self, run_ids: Sequence[str]) -> dict[str, RunRow]:
        found: dict[str, RunRow] = {}
        ids = list(dict.fromkeys(run_ids))
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            for row in await self._fetch(f"{_RUN_SQL} WHERE id IN ({marks})", chunk):
                found[row[0]] = _run(row)
        return found

    async def runs(
        self,
        *,
        status: str | None,
        conversation_id: str | None,
        limit: int,
        before: tuple[str, str] | None = None,
    ) -> list[RunRow]:
        """Runs newest first by (enqueued_at, id); ``before``: only those older than that key."""
        where: list[str] = []
        params: list[Any] = []
        if status is not None:
            where.append("status = ?")
            params.append(status)
        if conversation_id is not None:
            where.append("conversation_id = ?")
            params.append(conversation_id)
        if before is not None:
            where.append(f"({_RUN_KEY} < ? OR ({_RUN_KEY} = ? AND id < ?))")
            params += [before[0], before[0], before[1]]
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        rows = await self._fetch(
            f"{_RUN_SQL} {clause} ORDER BY {_RUN_KEY} DESC, id DESC LIMIT ?",
            [*params, limit],
        )
        return [_run(r) for r in rows]

    async def run_counts(self) -> dict[str, int]:
        """How many runs the table holds in each status."""
        rows = await self._fetch("SELECT status, count(*) FROM runs GROUP BY status")
        return {str(status): int(n) for status, n in rows}

    # --- checkpoints ------------------------------------------------------------

    async def _checkpointer(self) -> tuple[aiosqlite.Connection, AsyncSqliteSaver] | None:
        """The saver once the checkpoint tables exist (its setup() cannot create them read-only)."""
        conn = await self._connection()
        if conn is None or self._saver is None:
            return None
        if not self._checkpoints_ready:
            rows = await self._query(
                conn,
                "SELECT count(*) FROM sqlite_master"
                " WHERE type = 'table' AND name IN ('checkpoints', 'writes')",
            )
            if not rows or rows[0][0] < 2:
                return None
            self._checkpoints_ready = True
        return conn, self._saver

    async def read_thread(self, conversation_id: str, read: ThreadRead[T]) -> T | None:
        """``read(graph, config)`` on the conversation's thread, in a reader process.

        None while the checkpoint tables do not exist. The thread's state is read
        through LangGraph's state API (``get_state`` / ``get_state_history`` of a
        graph of the agent's shape), the only way to get its messages: a checkpoint
        stores what its step added, not the whole list. Rebuilding and decoding
        them is pure-Python CPU work that grows with the conversation: on the event
        loop it would hold up every stream of this process, and in a thread too, as
        it holds the interpreter lock (measured: a 400-message export made other
        streams' events late by 27 ms at the median, 470 ms at p95). So it runs in a
        process of its own, on a read-only connection of its own; ``read`` must be
        picklable (a module-level function, or a partial of one).
        """
        if await self._checkpointer() is None:
            return None
        if self._readers is None:
            # spawn: a fork of a process with threads (aiosqlite, anyio) is unsafe.
            self._readers = ProcessPoolExecutor(max_workers=READER_PROCESSES, mp_context=_SPAWN)
        uri = f"{self.path.as_uri()}?mode=ro"
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._readers, _read_thread, uri, conversation_id, read)
        except DatabaseUnavailable as exc:
            log.warning("database.read_failed", error=exc.message)
            raise


#: processes reading threads for one API process: as many exports at once
READER_PROCESSES = 2
_SPAWN = multiprocessing.get_context("spawn")


class _DecodedOnce(JsonPlusSerializer):
    """The strict serializer, decoding each stored blob once per read.

    Rebuilding a thread's state at a checkpoint replays the writes since the last
    full copy of its messages, so reading its whole history (the JSON Lines export)
    decodes each write again for every checkpoint after it, up to ~100 times: a
    400-message export spent 90% of its time building the same messages again
    (measured: 14.3 s → 2.0 s under load). What is decoded is only read, never
    changed, so one object per blob can serve every checkpoint.
    """

    def __init__(self) -> None:
        # Strict deserialization whatever the environment says (as for the async saver).
        super().__init__(allowed_msgpack_modules=None)
        self._decoded: dict[tuple[str, bytes], Any] = {}

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        if not isinstance(data[1], bytes):
            return super().loads_typed(data)
        try:
            return self._decoded[data]
        except KeyError:
            value = self._decoded[data] = super().loads_typed(data)
            return value


def _read_thread(uri: str, conversation_id: str, read: ThreadRead[T]) -> T:
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=5.0, check_same_thread=False)
    except sqlite3.Error as exc:
        raise DatabaseUnavailable(f"the database cannot be read: {exc}") from exc
    with contextlib.closing(conn):
        saver = SqliteSaver(conn, serde=_DecodedOnce())
        try:
            return read(reader_graph(saver), thread_config(conversation_id))
        except sqlite3.Error as exc:
            raise DatabaseUnavailable(f"the database cannot be read: {exc}") from exc
        except (DatabaseUnavailable, ConversationUnreadable):
            raise
        except Exception as exc:
            raise _unreadable(conversation_id, exc) from exc


def _unreadable(conversation_id: str, exc: Exception) -> ConversationUnreadable:
    """The checkpoint serializer refused the thread's data (it never runs what it refuses)."""
    return ConversationUnreadable(
        f"the saved state of conversation {conversation_id} cannot be read: {type(exc).__name__}: {exc}"
    )
