"""LangGraph's SQLite saver, each of its hot calls one trip to the connection's thread.

``AsyncSqliteSaver`` awaits every step of a write on aiosqlite's connection thread: a
checkpoint is an ``execute``, a ``commit`` and a cursor ``close`` (three hand-offs to the
thread and three wake-ups of the event loop), a task's writes four, a read of the thread's
latest checkpoint six. Those hand-offs were 39 of the worker's 41 thread hops per run
(bench figure 18). :class:`OneHopSaver` runs LangGraph's own *synchronous* ``SqliteSaver``
methods (the same SQL, the same serializer, the same commits) inside one call on that
thread, so each write or read is one hop.

Nothing else changes: it is the same connection (opened by
:func:`shared.storage.sqlite.connect`), the same schema (set up by the async saver), the
same lock around each call, and every other method is the async saver's own. A failed write
commits what the sync saver's ``cursor()`` commits (nothing was written) and leaves the
connection as before; :func:`shared.storage.checkpoints.end_failed_checkpoint_write` still
rolls back whatever is left open.

It reaches into aiosqlite (its ``sqlite3`` connection, and the call that runs a function on
its thread, which every public aiosqlite method is built on) and into the sync saver (whether
the writes table has ``task_path``), through shared/compat.py; tests/fast/test_compat.py
fails if those go away, tests/fast/test_sqlite_saver.py if they change what they do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import ChannelVersions, Checkpoint, CheckpointMetadata, CheckpointTuple
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from shared.compat import aiosqlite_call, aiosqlite_connection, share_task_path_support


class OneHopSaver(AsyncSqliteSaver):
    """``AsyncSqliteSaver`` whose ``aput``, ``aput_writes`` and ``aget_tuple`` take one hop each."""

    _sync: SqliteSaver | None = None

    async def setup(self) -> None:
        await super().setup()
        if self._sync is None:
            # The sqlite3 connection aiosqlite holds; used only on aiosqlite's own thread.
            sync = SqliteSaver(aiosqlite_connection(self.conn))
            sync.serde = self.serde
            sync.is_setup = True  # the async setup above made the tables and WAL
            share_task_path_support(self, sync)
            self._sync = sync

    async def _one_hop(self, method: str, *args: Any) -> Any:
        await self.setup()
        if self._sync is None:  # setup() builds it
            raise RuntimeError("the saver's synchronous half was not built")
        async with self.lock:
            return await aiosqlite_call(self.conn, getattr(self._sync, method), *args)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        result: CheckpointTuple | None = await self._one_hop("get_tuple", config)
        return result

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        result: RunnableConfig = await self._one_hop("put", config, checkpoint, metadata, new_versions)
        return result

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await self._one_hop("put_writes", config, writes, task_id, task_path)
