"""Read-only access to the workers' database: application tables and checkpoints.

:class:`Store` reads the SQLite file; :class:`PostgresStore` runs the same queries on
PostgreSQL (``DATABASE_URL``), its threads read by LangGraph's PostgreSQL saver.

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
- A failed connection is retired and another opened on the next call, and so is one
  whose file was replaced (new inode), so a recreated database is picked up. A
  retired connection is closed only once the reads using it are done.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite
import anyio
import psycopg
import structlog
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.pregel import Pregel
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from api.readers import Readers
from shared.contracts import RunStatus
from shared.errors import ConversationUnreadable, DatabaseUnavailable
from shared.rows import RUN_COLUMNS, RunRow
from shared.schema import MIGRATIONS
from shared.settings import Settings
from shared.storage.postgres import to_pg
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


_CONVERSATION_SQL = """
SELECT c.id, c.title, c.created_at, c.updated_at, c.message_count, c.pending_tasks, c.last_run_id,
       r.status, r.error_code, r.error_message
FROM conversations c LEFT JOIN runs r ON r.id = c.last_run_id
"""
_RUN_SQL = f"SELECT {RUN_COLUMNS} FROM runs"

#: the order of the runs listing (with ``id``): when a run was accepted
_RUN_KEY = "COALESCE(enqueued_at, started_at)"

# The conversations listing, newest first by (created_at, id): a key that never
# changes, so paging is stable while conversations are updated (shared/schema.py:
# the index ``conversations_listing`` serves it, a page costs the same at any size).
CONVERSATION_PAGE_SQL = f"{_CONVERSATION_SQL} ORDER BY c.created_at DESC, c.id DESC"
CONVERSATION_PAGE_AFTER_SQL = (
    f"{_CONVERSATION_SQL} WHERE (c.created_at, c.id) < (?, ?) ORDER BY c.created_at DESC, c.id DESC"
)
#: what /metrics shows of the runs table (index ``runs_by_status``)
RUNNING_COUNT_SQL = "SELECT count(*) FROM runs WHERE status = ?"
#: conversations whose last run ended waiting for a decision: the waiting runs through the status
#: index, each checked against its conversation's last run by primary key
WAITING_COUNT_SQL = (
    "SELECT count(*) FROM runs r JOIN conversations c ON c.id = r.conversation_id"
    " WHERE r.status = ? AND c.last_run_id = r.id"
)


def _conversation(row: Sequence[Any]) -> ConversationRow:
    return ConversationRow(
        id=row[0], title=row[1], created_at=row[2], updated_at=row[3], message_count=int(row[4] or 0),
        pending_tasks=bool(row[5]), last_run_id=row[6], last_status=row[7], last_error_code=row[8],
        last_error_message=row[9],
    )




def thread_config(conversation_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": conversation_id, "checkpoint_ns": ""}}


class CheckpointDecodeError(Exception):
    """The serializer could not decode a stored checkpoint or write (damaged, or refused)."""


class _DecodingSerializer(JsonPlusSerializer):
    """The strict serializer, its failures told apart from the connection's.

    The saver decodes inside the same call that queries, so an error from a
    closed or broken connection and one from a damaged blob arrive the same way;
    only the second is the conversation's fault (CONVERSATION_UNREADABLE).
    """

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        try:
            return super().loads_typed(data)
        except Exception as exc:
            raise CheckpointDecodeError(f"{type(exc).__name__}: {exc}") from exc


@dataclass(slots=True, eq=False)
class _Handle:
    """One opened connection and its saver, closed once retired *and* no query uses it."""

    conn: aiosqlite.Connection
    saver: AsyncSqliteSaver
    identity: tuple[int, int]
    users: int = 0
    retired: bool = False


class Store:
    """The API's read-only view of the database file, opened lazily.

    Every read leases the current connection (:meth:`_lease`). A connection found
    broken, or replaced because the file was, is retired: new reads open another,
    and the retired one is closed when the last read using it ends, never under a
    read in flight (which would fail with aiosqlite's "Connection closed").
    """

    def __init__(self, path: Path, readers: Readers, *, hang_read: str | None = None) -> None:
        self.path = path
        self._handle: _Handle | None = None
        self._schema_ready = False
        self._checkpoints_ready = False
        self._lock = asyncio.Lock()
        self.readers = readers
        #: test-only (SOPHOS_FAULT_HANG_READ): reads of this conversation never end
        self._hang_read = hang_read

    def open(self) -> None:
        """Start one reader process in the background, ahead of the first read.

        Started on the first read instead, a reader made that read wait for the
        process to import LangGraph: about a second on a quiet machine (measured:
        1.6 to 2.7 s for the first detail or decision under load, 0.01 to 0.03 s after).
        """
        self.readers.warm()

    async def close(self) -> None:
        async with self._lock:
            handle, self._handle = self._handle, None
            if handle is not None:
                handle.retired = True
                await _close(handle.conn)
        await self.readers.aclose()

    # --- connection -------------------------------------------------------------

    async def _retire(self, handle: _Handle) -> None:
        """Stop handing ``handle`` out; close it now if no read is using it (lock held)."""
        if self._handle is handle:
            self._handle = None
            self._schema_ready = self._checkpoints_ready = False
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
            # A first read proves the connection usable (see the module docstring).
            await (await conn.execute("PRAGMA user_version")).close()
        except sqlite3.Error as exc:
            if conn is not None:
                await _close(conn)
            raise DatabaseUnavailable(f"the database cannot be read: {exc}") from exc
        # Strict deserialization whatever the environment says: the API only
        # needs the message types on the allowlist.
        saver = AsyncSqliteSaver(conn, serde=_DecodingSerializer(allowed_msgpack_modules=None))
        self._handle = _Handle(conn, saver, identity)
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
            raise DatabaseUnavailable(f"the database cannot be read: {exc}") from exc
        finally:
            # Shielded: a read cancelled by its client must still give the connection back.
            with anyio.CancelScope(shield=True):
                async with self._lock:
                    handle.users -= 1
                    if handle.retired and handle.users == 0:
                        await _close(handle.conn)

    async def schema_version(self) -> int | None:
        """``PRAGMA user_version`` of the file, or None when it does not exist."""
        async with self._lease() as handle:
            if handle is None:
                return None
            rows = await _rows(handle.conn, "PRAGMA user_version")
        return int(rows[0][0]) if rows else 0

    async def _fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Rows of ``sql`` once the worker has created the application tables ([] before)."""
        if not self._schema_ready:
            version = await self.schema_version()
            if version is None or version < len(MIGRATIONS):
                return []
            self._schema_ready = True
        async with self._lease() as handle:
            return [] if handle is None else await _rows(handle.conn, sql, params)

    # --- application tables -----------------------------------------------------

    async def conversation(self, conversation_id: str) -> ConversationRow | None:
        rows = await self._fetch(f"{_CONVERSATION_SQL} WHERE c.id = ?", (conversation_id,))
        return _conversation(rows[0]) if rows else None

    async def conversations(
        self, *, limit: int, before: tuple[str, str] | None = None
    ) -> list[ConversationRow]:
        """Conversations newest first by (created_at, id); ``before``: only those older than that key."""
        if before is None:
            rows = await self._fetch(f"{CONVERSATION_PAGE_SQL} LIMIT ?", (limit,))
        else:
            rows = await self._fetch(f"{CONVERSATION_PAGE_AFTER_SQL} LIMIT ?", (*before, limit))
        return [_conversation(r) for r in rows]

    async def existing_conversations(self, conversation_ids: Sequence[str]) -> set[str]:
        """Which of these conversations have a row."""
        found: set[str] = set()
        ids = list(dict.fromkeys(conversation_ids))
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            rows = await self._fetch(f"SELECT id FROM conversations WHERE id IN ({marks})", chunk)
            found.update(str(r[0]) for r in rows)
        return found

    async def run(self, run_id: str) -> RunRow | None:
        rows = await self._fetch(f"{_RUN_SQL} WHERE id = ?", (run_id,))
        return RunRow.from_row(rows[0]) if rows else None

    async def runs_by_id(self, run_ids: Sequence[str]) -> dict[str, RunRow]:
        found: dict[str, RunRow] = {}
        ids = list(dict.fromkeys(run_ids))
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            for row in await self._fetch(f"{_RUN_SQL} WHERE id IN ({marks})", chunk):
                found[row[0]] = RunRow.from_row(row)
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
        return [RunRow.from_row(r) for r in rows]

    async def running_count(self) -> int:
        """How many runs are recorded ``running`` (a search of the status index, not a scan)."""
        rows = await self._fetch(RUNNING_COUNT_SQL, (RunStatus.RUNNING.value,))
        return int(rows[0][0]) if rows else 0

    async def waiting_count(self) -> int:
        """How many conversations wait for a decision on a tool call (their last run ended ``waiting``)."""
        rows = await self._fetch(WAITING_COUNT_SQL, (RunStatus.WAITING.value,))
        return int(rows[0][0]) if rows else 0

    # --- checkpoints ------------------------------------------------------------

    @asynccontextmanager
    async def _checkpointer(self) -> AsyncIterator[AsyncSqliteSaver | None]:
        """The saver once the checkpoint tables exist (its setup() cannot create them read-only)."""
        async with self._lease() as handle:
            if handle is None:
                yield None
                return
            if not self._checkpoints_ready:
                rows = await _rows(
                    handle.conn,
                    "SELECT count(*) FROM sqlite_master"
                    " WHERE type = 'table' AND name IN ('checkpoints', 'writes')",
                )
                if not rows or rows[0][0] < 2:
                    yield None
                    return
                self._checkpoints_ready = True
            yield handle.saver

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
        picklable (a module-level function, or a partial of one). A read that
        outlasts READ_TIMEOUT, or whose request is cancelled, stops its reader
        (api/readers.py): 503 READ_TIMEOUT.
        """
        async with self._checkpointer() as saver:
            if saver is None:
                return None
        uri = f"{self.path.as_uri()}?mode=ro"
        return await self._read_in_reader(_read_thread, uri, conversation_id, read)

    async def _read_in_reader(
        self, reader: Callable[[str, str, ThreadRead[T]], T], source: str, conversation_id: str,
        read: ThreadRead[T],
    ) -> T:
        """``reader(source, conversation_id, read)`` in a reader process, bounded by READ_TIMEOUT."""
        if conversation_id == self._hang_read:
            read = functools.partial(_hang, read)
        try:
            return await self.readers.run(
                reader, source, conversation_id, read, what=f"conversation {conversation_id}"
            )
        except DatabaseUnavailable as exc:
            log.warning("database.read_failed", error=exc.message)
            raise


#: processes reading threads for one API process: as many exports at once
READER_PROCESSES = 2
#: what a reader imports before its first read (the functions reads send it come from these)
READER_MODULES = ("api.store", "api.transcript", "api.approvals")


def _hang(read: ThreadRead[T], graph: Pregel[Any, Any, Any, Any], config: RunnableConfig) -> T:
    """Test-only (SOPHOS_FAULT_HANG_READ): a read that never ends, as one of a huge thread would not."""
    while True:
        time.sleep(3600)


class _DecodedOnce(_DecodingSerializer):
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
            # This process has its own connection and only decodes and rebuilds the
            # thread: what fails here, short of SQLite itself, is the thread's data.
            raise _unreadable(conversation_id, exc) from exc


#: What a stored checkpoint that cannot be decoded raises: the serializer's refusal
#: (wrapped), or metadata that is not JSON (the saver decodes it with ``json.loads``).
#: A closed or broken connection raises something else and is not the conversation's fault.
_DECODING_ERRORS = (CheckpointDecodeError, json.JSONDecodeError, UnicodeDecodeError)


async def _rows(conn: aiosqlite.Connection, sql: str, params: Sequence[Any] = ()) -> list[Any]:
    async with conn.execute(sql, params) as cur:
        return list(await cur.fetchall())


async def _close(conn: aiosqlite.Connection) -> None:
    try:
        await conn.close()
    except sqlite3.Error as exc:
        log.warning("database.close_failed", error=str(exc))


def _unreadable(conversation_id: str, exc: Exception) -> ConversationUnreadable:
    """The checkpoint serializer refused the thread's data (it never runs what it refuses)."""
    reason = str(exc) if isinstance(exc, CheckpointDecodeError) else f"{type(exc).__name__}: {exc}"
    return ConversationUnreadable(
        f"the saved state of conversation {conversation_id} cannot be read: {reason}"
    )


class PostgresStore(Store):
    """The API's view of a PostgreSQL database (``DATABASE_URL``): the same queries, on a pool.

    The pool opens lazily and connects in the background, so the API starts before the
    database is reachable; a query that finds no connection within a few seconds, or loses
    one, is DATABASE_UNAVAILABLE, and the next call tries again. The workers migrate; until
    the first has, there is nothing to read (as with SQLite before the file exists).
    """

    def __init__(self, url: str, readers: Readers, *, hang_read: str | None = None) -> None:
        super().__init__(Path(os.devnull), readers, hang_read=hang_read)
        self.url = url
        self._pool: AsyncConnectionPool | None = None

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
        await super().close()

    async def _query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        if self._pool is None:
            async with self._lock:
                if self._pool is None:
                    pool: AsyncConnectionPool = AsyncConnectionPool(
                        self.url, min_size=1, max_size=4, open=False, timeout=5.0,
                        kwargs={"autocommit": True, "prepare_threshold": None},
                    )
                    await pool.open(wait=False)
                    self._pool = pool
                    log.info("database.opened", database=_without_password(self.url))
        try:
            async with self._pool.connection() as conn:
                cursor = await conn.execute(to_pg(sql), params)
                return [tuple(r) for r in await cursor.fetchall()]
        except (psycopg.Error, PoolTimeout) as exc:
            log.warning("database.read_failed", error=str(exc))
            raise DatabaseUnavailable(f"the database cannot be read: {exc}") from exc

    async def schema_version(self) -> int | None:
        rows = await self._query("SELECT to_regclass('sophos_schema') IS NOT NULL")
        if not rows or not rows[0][0]:
            return None
        rows = await self._query("SELECT version FROM sophos_schema")
        return int(rows[0][0]) if rows else 0

    async def _fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        if not self._schema_ready:
            version = await self.schema_version()
            if version is None or version < len(MIGRATIONS):
                return []
            self._schema_ready = True
        return await self._query(sql, params)

    async def read_thread(self, conversation_id: str, read: ThreadRead[T]) -> T | None:
        if not self._checkpoints_ready:
            rows = await self._query(
                "SELECT to_regclass('checkpoints') IS NOT NULL"
                " AND to_regclass('checkpoint_writes') IS NOT NULL"
            )
            if not rows or not rows[0][0]:
                return None
            self._checkpoints_ready = True
        return await self._read_in_reader(_read_thread_postgres, self.url, conversation_id, read)


def open_store(settings: Settings) -> Store:
    """The API's store: the SQLite file read-only, or the PostgreSQL database (call ``open`` next)."""
    readers = Readers(size=READER_PROCESSES, timeout=settings.read_timeout, preload=READER_MODULES)
    if settings.database_url is not None:
        return PostgresStore(settings.database_url, readers, hang_read=settings.fault_hang_read)
    return Store(settings.database_path, readers, hang_read=settings.fault_hang_read)


def _without_password(url: str) -> str:
    return Settings(database_url=url).database_name


def _read_thread_postgres(url: str, conversation_id: str, read: ThreadRead[T]) -> T:
    try:
        conn = psycopg.connect(url, autocommit=True, prepare_threshold=0, row_factory=dict_row)
    except psycopg.Error as exc:
        raise DatabaseUnavailable(f"the database cannot be read: {exc}") from exc
    with conn:
        saver = PostgresSaver(conn, serde=_DecodedOnce())
        try:
            return read(reader_graph(saver), thread_config(conversation_id))
        except psycopg.Error as exc:
            raise DatabaseUnavailable(f"the database cannot be read: {exc}") from exc
        except (DatabaseUnavailable, ConversationUnreadable):
            raise
        except Exception as exc:
            raise _unreadable(conversation_id, exc) from exc
