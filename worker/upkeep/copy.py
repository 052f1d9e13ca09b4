"""``python -m worker --copy-to postgresql://…``: a SQLite deployment's data, into an empty PostgreSQL.

Copies every conversation, run and LangGraph thread of the file Settings names
(``DATABASE_PATH``), so that the same conversations list, export and resume once the
services run with ``DATABASE_URL`` set to the target. Refused (exit 2, one line on
stderr) when the target is not a PostgreSQL URL or already holds data, when the file
does not exist, or while a worker holds the file's writer lock: the copy takes that
lock for its duration, so no write can land in the file behind it.

- **Threads** go through the PostgreSQL saver's own ``aput``, each checkpoint with the
  channels that changed since its parent (what the worker's loop passes), so the rows
  are those a worker on PostgreSQL would have written: channel values split into
  ``checkpoint_blobs``, DeltaChannel snapshots marked as the saver marks them. Every
  checkpoint is copied, not only each thread's last: the messages are a DeltaChannel
  (shared/storage/threads/state.py), rebuilt from the writes back to the last snapshot. Writes are
  copied as stored (task path and index included, the serializer being the same on
  both sides), because a tuple read back through the saver drops both.
- **One transaction**: the target holds all of it or, if anything fails, nothing (and
  the copy can simply be run again). The migrations before it are idempotent.
- **Runs** are copied as they are, leases NULL. A run still ``running`` was a dead
  worker's (the lock was free); a NULL lease counts as lapsed, so the first worker on
  PostgreSQL records it ``interrupted`` at start-up (worker/run/lifetime/recovery.py), computing what
  recovery on SQLite would have, and the conversation resumes from its checkpoint.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import aiosqlite
import psycopg
import structlog
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import ChannelVersions
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from psycopg.rows import DictRow, dict_row, tuple_row

from shared.settings import Settings
from shared.storage.postgres import migrate
from worker.lock import WorkerLockHeld, WriterLock

log = structlog.get_logger(__name__)

USAGE = "usage: python -m worker --copy-to postgresql://user@host:5432/DATABASE"

#: the tables that must hold no row for the copy to go ahead: the application's and the saver's
TARGET_TABLES = (
    "conversations", "runs", "tool_calls", "checkpoints", "checkpoint_blobs", "checkpoint_writes",
)

CONVERSATION_COLUMNS = "id, title, created_at, updated_at, message_count, pending_tasks, last_run_id"
# The lease columns are left out, so NULL: on SQLite they are always NULL.
RUN_COLUMNS = (
    "id, conversation_id, kind, status, error_code, error_message, enqueued_at, started_at,"
    " finished_at, step_count"
)
#: the ledger of tool calls (worker/tools/ledger/): a call it records done is never sent again
TOOL_CALL_COLUMNS = (
    "conversation_id, message_id, tool_call_id, run_id, tool, arguments, idempotency_key, attempt,"
    " state, status, result, intent_at, outcome_at"
)
#: rows sent to PostgreSQL per executemany
BATCH = 500


class CopyRefused(Exception):
    """The copy will not start: the message says why, in one line."""


@dataclass(frozen=True, slots=True)
class Copied:
    conversations: int
    runs: int
    threads: int
    checkpoints: int
    writes: int
    running_runs: int
    seconds: float

    def summary(self, target: str) -> str:
        return (
            f"copied {self.conversations} conversations, {self.runs} runs, {self.threads} threads"
            f" ({self.checkpoints} checkpoints, {self.writes} writes) to {target} in {self.seconds:.2f}s"
        )


def copy_to(settings: Settings, args: Sequence[str]) -> int:
    """The ``--copy-to`` command: 0 copied, 2 refused, 1 failed (nothing copied)."""
    target = args[0] if len(args) == 1 else None
    shown = Settings(database_url=target).database_name if target else ""
    lock = WriterLock(settings.lock_path)
    try:
        if target is None:
            raise CopyRefused(USAGE)
        check_target_url(target)
        source = settings.database_path
        if not source.is_file():
            raise CopyRefused(f"there is no SQLite database at {source} (DATABASE_PATH) to copy")
        try:
            lock.acquire()
        except WorkerLockHeld as exc:
            raise CopyRefused(f"a worker is running on {source} ({exc}); stop it first") from None
        copied = asyncio.run(copy_database(source.absolute(), target))
    except CopyRefused as exc:
        print(f"sophos-worker: cannot copy: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        # The database unreachable, or a row that does not decode: the transaction was rolled
        # back, so running the copy again once the cause is fixed is safe.
        message = " ".join(f"{type(exc).__name__}: {exc}".split())
        if isinstance(exc, psycopg.OperationalError):
            log.error("copy.failed", target=shown, error=message)  # unreachable: no traceback to read
        else:
            log.exception("copy.failed", target=shown)
        print(f"sophos-worker: the copy to {shown} failed, nothing was copied: {message}", file=sys.stderr)
        return 1
    finally:
        lock.release()
    print(copied.summary(shown))
    return 0


def check_target_url(url: str) -> None:
    parsed = urlparse(url)
    if parsed.scheme not in ("postgresql", "postgres"):
        raise CopyRefused(f"the target must be a postgresql:// URL, got {parsed.scheme or url!r}")
    if not parsed.path.strip("/"):
        raise CopyRefused("the target URL names no database (postgresql://user@host:5432/DATABASE)")


async def copy_database(source: Path, target: str) -> Copied:
    """Copy the conversations, runs and threads of ``source`` (absolute) into an empty ``target``."""
    started = time.monotonic()
    shown = Settings(database_url=target).database_name
    log.info("copy.started", source=str(source), target=shown)
    # Read-only: the file is left as it was (the lock keeps the worker away meanwhile).
    sqlite = await aiosqlite.connect(f"{source.as_uri()}?mode=ro", uri=True)
    try:
        async with await psycopg.AsyncConnection.connect(target, autocommit=True) as probe:
            # Before migrating: a database in use is refused without being touched.
            await _refuse_unless_empty(probe, shown)
        async with await psycopg.AsyncConnection.connect(
            target, autocommit=True, row_factory=dict_row, prepare_threshold=0
        ) as setup:
            # The same migrations a worker starting on PostgreSQL runs (worker/resources.py).
            await migrate(target, also=AsyncPostgresSaver(setup).setup)
        async with await psycopg.AsyncConnection.connect(
            target, row_factory=dict_row, prepare_threshold=0
        ) as conn, conn.transaction():
            # A worker or another copy started on the target meanwhile writes after us or
            # not at all, and we see what it wrote before.
            await conn.execute(f"LOCK TABLE {', '.join(TARGET_TABLES)} IN EXCLUSIVE MODE")
            await _refuse_unless_empty(conn, shown)
            copied = await _copy(sqlite, conn, started)
    finally:
        await sqlite.close()
    log.info(
        "copy.finished", target=shown, conversations=copied.conversations, runs=copied.runs,
        threads=copied.threads, checkpoints=copied.checkpoints, writes=copied.writes,
        seconds=round(copied.seconds, 3),
    )
    if copied.running_runs:
        log.warning(
            "copy.running_runs", runs=copied.running_runs,
            detail="a dead worker's runs; the first worker on PostgreSQL records them interrupted",
        )
    return copied


async def _refuse_unless_empty(conn: psycopg.AsyncConnection[Any], shown: str) -> None:
    holding = []
    async with conn.cursor(row_factory=tuple_row) as cur:
        for table in TARGET_TABLES:
            await cur.execute("SELECT to_regclass(%s) IS NOT NULL", (table,))
            exists = await cur.fetchone()
            if not (exists and exists[0]):
                continue
            await cur.execute(f"SELECT EXISTS (SELECT 1 FROM {table})")  # noqa: S608 - our names
            row = await cur.fetchone()
            if row and row[0]:
                holding.append(table)
    if holding:
        raise CopyRefused(
            f"{shown} is not empty (it holds {', '.join(holding)}); copy only into an empty database"
        )


async def _copy(
    sqlite: aiosqlite.Connection, conn: psycopg.AsyncConnection[DictRow], started: float
) -> Copied:
    listed = await sqlite.execute_fetchall("SELECT name FROM sqlite_master WHERE type = 'table'")
    tables = {str(r[0]) for r in listed}
    conversations = runs = running = 0
    if "conversations" in tables:
        present = {str(r[1]) for r in await sqlite.execute_fetchall("PRAGMA table_info(conversations)")}
        # The branch a conversation follows (Branches): a file from before it has no column (nor branches).
        columns = CONVERSATION_COLUMNS
        if "branch_head" in present:
            columns += ", branch_head, forked"
        conversations = await _copy_rows(sqlite, conn, "conversations", columns)
    if "runs" in tables:
        present = {str(r[1]) for r in await sqlite.execute_fetchall("PRAGMA table_info(runs)")}
        # A file no worker of this version has opened has no breakdown column (nor breakdowns).
        columns = f"{RUN_COLUMNS}, breakdown" if "breakdown" in present else RUN_COLUMNS
        runs = await _copy_rows(sqlite, conn, "runs", columns)
        rows = await sqlite.execute_fetchall("SELECT count(*) FROM runs WHERE status = 'running'")
        running = int(next(iter(rows))[0])
    if "tool_calls" in tables:
        listed = await sqlite.execute_fetchall("PRAGMA table_info(tool_calls)")
        # safe_to_repeat: migration 6; a file the worker last opened before it has none (NULL).
        extra = ", safe_to_repeat" if "safe_to_repeat" in {str(r[1]) for r in listed} else ""
        await _copy_rows(sqlite, conn, "tool_calls", TOOL_CALL_COLUMNS + extra)
    threads = checkpoints = writes = 0
    saver = AsyncPostgresSaver(conn)
    if "checkpoints" in tables:
        threads, checkpoints = await _copy_checkpoints(sqlite, saver)
    if "writes" in tables:
        writes = await _copy_writes(sqlite, conn)
    # What PostgreSQL now holds is what was read, or the transaction does not commit.
    for table, expected in (("checkpoints", checkpoints), ("checkpoint_writes", writes)):
        cursor = await conn.execute(f"SELECT count(*) AS n FROM {table}")  # noqa: S608 - our names
        row = await cursor.fetchone()
        if row is None or int(row["n"]) != expected:
            raise psycopg.DataError(f"{table}: {row and row['n']} rows on PostgreSQL, {expected} read")
    return Copied(
        conversations=conversations, runs=runs, threads=threads, checkpoints=checkpoints, writes=writes,
        running_runs=running, seconds=time.monotonic() - started,
    )


async def _copy_rows(
    sqlite: aiosqlite.Connection, conn: psycopg.AsyncConnection[DictRow], table: str, columns: str
) -> int:
    marks = ", ".join(["%s"] * len(columns.split(",")))
    insert = f"INSERT INTO {table} ({columns}) VALUES ({marks})"  # noqa: S608 - our names
    count = 0
    async with sqlite.execute(f"SELECT {columns} FROM {table}") as rows, conn.cursor() as cur:  # noqa: S608
        while batch := [tuple(r) for r in await rows.fetchmany(BATCH)]:
            await cur.executemany(insert, batch)
            count += len(batch)
    return count


async def _copy_checkpoints(sqlite: aiosqlite.Connection, saver: AsyncPostgresSaver) -> tuple[int, int]:
    """Every checkpoint, oldest first within each thread, through the saver; (threads, checkpoints)."""
    threads = count = 0
    current: tuple[str, str] | None = None
    versions: dict[str, ChannelVersions] = {}  # channel versions of this thread's checkpoints so far
    async with sqlite.execute(
        "SELECT thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata"
        " FROM checkpoints ORDER BY thread_id, checkpoint_ns, checkpoint_id"
    ) as rows:
        async for thread_id, ns, checkpoint_id, parent_id, type_, blob, metadata in rows:
            if (thread_id, ns) != current:
                if current is None or current[0] != thread_id:
                    threads += 1
                current, versions = (thread_id, ns), {}
            checkpoint = saver.serde.loads_typed((type_, blob))
            channel_versions: ChannelVersions = checkpoint["channel_versions"]
            parent = versions.get(parent_id) if parent_id else None
            # What the worker's loop passes: the channels whose version changed since the parent.
            # Without the parent at hand (never, with ids in time order), all of them: the
            # saver writes a blob once per channel version, whatever it is asked.
            new_versions = (
                {k: v for k, v in channel_versions.items() if parent.get(k) != v}
                if parent is not None else dict(channel_versions)
            )
            configurable: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ns}
            if parent_id:
                configurable["checkpoint_id"] = parent_id  # the saver records it as the parent
            config: RunnableConfig = {"configurable": configurable}
            await saver.aput(config, checkpoint, json.loads(metadata) if metadata else {}, new_versions)
            versions[checkpoint_id] = channel_versions
            count += 1
    return threads, count


async def _copy_writes(sqlite: aiosqlite.Connection, conn: psycopg.AsyncConnection[DictRow]) -> int:
    columns = {str(r[1]) for r in await sqlite.execute_fetchall("PRAGMA table_info(writes)")}
    # A file whose saver never added task_path: what the saver reads there instead.
    task_path = "task_path" if "task_path" in columns else "''"
    count = 0
    async with sqlite.execute(
        f"SELECT thread_id, checkpoint_ns, checkpoint_id, task_id, {task_path}, idx, channel, type, value"  # noqa: S608
        " FROM writes ORDER BY thread_id, checkpoint_ns, checkpoint_id, task_id, idx"
    ) as rows, conn.cursor() as cur:
        while batch := [tuple(r) for r in await rows.fetchmany(BATCH)]:
            await cur.executemany(AsyncPostgresSaver.INSERT_CHECKPOINT_WRITES_SQL, batch)
            count += len(batch)
    return count
