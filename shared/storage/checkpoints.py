"""What the worker asks of LangGraph's savers that differs by engine, answered here.

The run service and start-up recovery hold a saver and ask engine-neutral questions;
the branches on which saver it is live in this module, beside the rest of the storage.
"""

from __future__ import annotations

from typing import Any

import aiosqlite
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.checkpoint.sqlite.utils import search_where

from shared.storage.sqlite import end_failed_transaction


async def input_recorded(saver: BaseCheckpointSaver[Any], thread: RunnableConfig, run_id: str) -> bool:
    """Whether a checkpoint of ``thread`` carries ``run_id``, decoding none where the engine allows.

    Raises what the saver raises (metadata that is not JSON makes the filter fail).
    """
    if isinstance(saver, AsyncSqliteSaver):
        # The saver's own filter (a json_extract on the metadata column), on its own
        # connection and lock: a row is looked for, not decoded.
        where, params = search_where(thread, {"run_id": run_id})
        async with saver.lock, saver.conn.execute(
            # `where` is built by the saver from fixed column names; values are bound.
            f"SELECT 1 FROM checkpoints {where} LIMIT 1", params  # noqa: S608
        ) as cursor:
            return await cursor.fetchone() is not None
    return bool([c async for c in saver.alist(thread, filter={"run_id": run_id}, limit=1)])


async def end_failed_checkpoint_write(saver: BaseCheckpointSaver[Any] | None) -> None:
    """Roll back what a failed (or cut) checkpoint write left open on the saver's connection.

    Left open, SQLite's transaction keeps an old snapshot: once the application tables
    (another connection) commit, every later checkpoint write fails at once with
    "database is locked" (SQLITE_BUSY_SNAPSHOT), long after the lock is gone.
    PostgreSQL's saver writes in a transaction block of its own, rolled back on failure.
    """
    conn, lock = getattr(saver, "conn", None), getattr(saver, "lock", None)
    if isinstance(conn, aiosqlite.Connection) and lock is not None:
        async with lock:
            await end_failed_transaction(conn)
