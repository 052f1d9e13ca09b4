"""The worker's SQLite saver (shared/storage/sqlite_saver.py): LangGraph's own rows, one hop a call.

On real files: what one saver writes the other reads back the same, each hot call is one
trip to aiosqlite's thread (so the private ``Connection._execute`` it relies on is checked
against the pinned aiosqlite), and a write refused by a lock leaves the saver usable once
the lock is gone.
"""

from __future__ import annotations

import collections
import sqlite3
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiosqlite
import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import Checkpoint, empty_checkpoint
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from shared.storage.checkpoints import end_failed_checkpoint_write
from shared.storage.sqlite import connect
from shared.storage.sqlite_saver import OneHopSaver

pytestmark = pytest.mark.fast


@pytest.fixture
async def files(tmp_path: Path) -> AsyncIterator[tuple[OneHopSaver, AsyncSqliteSaver]]:
    """The worker's saver and LangGraph's, each on its own connection to one file."""
    path = tmp_path / "sophos.db"
    one, stock = await connect(path), await connect(path)
    try:
        ours, theirs = OneHopSaver(one), AsyncSqliteSaver(stock)
        await ours.setup()
        await theirs.setup()
        yield ours, theirs
    finally:
        await one.close()
        await stock.close()


def _checkpoint(n: int) -> Checkpoint:
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"messages": [HumanMessage(f"hello {n}", id=f"m{n}")]}
    checkpoint["channel_versions"] = {"messages": n}
    return checkpoint


def _thread(name: str, checkpoint_id: str | None = None) -> RunnableConfig:
    configurable: dict[str, Any] = {"thread_id": name, "checkpoint_ns": ""}
    if checkpoint_id:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


@contextmanager
def _hops() -> Iterator[collections.Counter[str]]:
    counts: collections.Counter[str] = collections.Counter()
    execute = aiosqlite.Connection._execute

    async def counted(self: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
        counts[getattr(fn, "__name__", "call")] += 1
        return await execute(self, fn, *args, **kwargs)

    aiosqlite.Connection._execute = counted  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        aiosqlite.Connection._execute = execute  # type: ignore[method-assign]


async def _write_thread(saver: AsyncSqliteSaver, name: str) -> RunnableConfig:
    first = await saver.aput(_thread(name), _checkpoint(1), {"source": "input", "step": -1}, {})
    await saver.aput_writes(first, [("messages", [AIMessage("hi", id="a1")])], "task-1", "~path")
    second = await saver.aput(first, _checkpoint(2), {"source": "loop", "step": 0, "run_id": "r"}, {})
    await saver.aput_writes(second, [("__interrupt__", ["ask"]), ("branch:to:tools", None)], "task-2")
    return second


@pytest.mark.parametrize("writer", ["ours", "theirs"])
async def test_what_one_saver_writes_the_other_reads_the_same(
    files: tuple[OneHopSaver, AsyncSqliteSaver], writer: str
) -> None:
    ours, theirs = files
    written = await _write_thread(ours if writer == "ours" else theirs, writer)
    for config in (_thread(writer), written, _thread(writer, written["configurable"]["checkpoint_id"])):
        mine, stock = await ours.aget_tuple(config), await theirs.aget_tuple(config)
        assert mine is not None and stock is not None
        assert mine == stock
    latest = await ours.aget_tuple(_thread(writer))
    assert latest is not None
    assert latest.checkpoint["channel_values"]["messages"][0].content == "hello 2"
    assert latest.metadata["run_id"] == "r"
    writes = [(channel, value) for _task, channel, value in latest.pending_writes]
    assert writes == [("__interrupt__", ["ask"]), ("branch:to:tools", None)]
    assert latest.parent_config is not None
    assert await ours.aget_tuple(_thread("nobody")) is None


async def test_each_hot_call_is_one_hop_to_the_connection_thread(
    files: tuple[OneHopSaver, AsyncSqliteSaver],
) -> None:
    ours, theirs = files
    with _hops() as ours_hops:
        await _write_thread(ours, "counted")
        await ours.aget_tuple(_thread("counted"))
    assert dict(ours_hops) == {"put": 2, "put_writes": 2, "get_tuple": 1}
    with _hops() as stock_hops:
        await _write_thread(theirs, "stock")
        await theirs.aget_tuple(_thread("stock"))
    assert sum(stock_hops.values()) > 3 * sum(ours_hops.values())


async def test_a_write_refused_by_a_lock_leaves_the_saver_usable(
    files: tuple[OneHopSaver, AsyncSqliteSaver], tmp_path: Path
) -> None:
    ours, _ = files
    first = await ours.aput(_thread("locked"), _checkpoint(1), {"step": -1}, {})
    await ours.conn.execute("PRAGMA busy_timeout=50")
    holder = sqlite3.connect(tmp_path / "sophos.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another writer holds the file's write lock
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            await ours.aput(first, _checkpoint(2), {"step": 0}, {})
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    await end_failed_checkpoint_write(ours)
    second = await ours.aput(first, _checkpoint(2), {"step": 0}, {})
    latest = await ours.aget_tuple(_thread("locked"))
    assert latest is not None and latest.config == second
