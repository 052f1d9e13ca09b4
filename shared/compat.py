"""Every reach of ``shared/`` (and so of the API) into another library's private names.

Each one here, and nowhere else, with the version it was read from; tests/fast/test_compat.py
fails when an installed library no longer has what is used (the name, its signature, or the
source of what is overridden). Whoever upgrades one of these libraries reads its new code
where that test points, brings the use here in line, and updates the version and the test.
The worker's reaches into arq's loop are in worker/compat.py.

Nothing is imported until it is used: the API's main process imports this module (through
shared/speedups.py) and must load neither LangGraph, nor a database driver, nor the fetch
server by it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import aiosqlite
    import httpx
    import psycopg
    from langchain_core.messages import AnyMessage
    from psycopg.rows import DictRow

#: the versions each use below was read from (the lock pins them: requirements.lock)
READ_FROM = {
    "redis": "5.3.1",
    "mcp-server-fetch": "2026.10.10",
    "langgraph": "1.2.24",
    "aiosqlite": "0.22.1",
    "langgraph-checkpoint-sqlite": "3.1.2",
    "langgraph-checkpoint-postgres": "3.2.0",
    "httpx": "0.29.0",
}


# --- redis-py 5.3.1: its reply parsers (shared/speedups.py) ----------------------------------
# A pool takes a parser class (``parser_class``), but the classes themselves are importable only
# from the private ``redis._parsers``.


def redis_parsers() -> tuple[type[Any], type[Any]]:
    """redis-py's asyncio reply parsers: (hiredis's, its own pure-Python RESP2 one)."""
    from redis._parsers import _AsyncHiredisParser, _AsyncRESP2Parser

    return _AsyncHiredisParser, _AsyncRESP2Parser


# --- mcp-server-fetch 2026.10.10: its rule of a public address (shared/pinned.py) ----------------


def fetch_is_public_address(address: str) -> bool:
    """mcp-server-fetch's ``_is_public_address``: the fetch tool's own rule, which the pinned
    transport and webhooks apply too. The module costs about half a second to import."""
    from mcp_server_fetch.server import _is_public_address

    return bool(_is_public_address(address))


# --- langgraph 1.2.24: the batch reducer of a DeltaChannel of messages (shared/storage/thread.py) --


def messages_delta_reducer() -> Callable[[list[AnyMessage], list[list[AnyMessage]]], list[AnyMessage]]:
    """LangGraph's private, "experimental" ``_messages_delta_reducer``: it assigns no message ids;
    LangGraph's loop stamps them (``ensure_message_ids``) on every write to a DeltaChannel whose
    reducer is this very function, before the write is saved. So it must be this object."""
    from langgraph.graph.message import _messages_delta_reducer

    return _messages_delta_reducer


# --- aiosqlite 0.22.1, langgraph-checkpoint-sqlite 3.1.2 (shared/storage/sqlite_saver.py) --------


def aiosqlite_connection(conn: aiosqlite.Connection) -> sqlite3.Connection:
    """The ``sqlite3`` connection aiosqlite holds (``Connection._conn``): to be used only on
    aiosqlite's own thread, through :func:`aiosqlite_call`."""
    raw: sqlite3.Connection = conn._conn
    return raw


async def aiosqlite_call(conn: aiosqlite.Connection, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` on the connection's thread, awaited: aiosqlite's ``Connection._execute``,
    which every one of its public methods is built on."""
    return await conn._execute(fn, *args)


def share_task_path_support(source: Any, target: Any) -> None:
    """Tell the sync ``SqliteSaver`` ``target`` what the async saver ``source`` found when it set
    up the tables: whether ``writes`` has the ``task_path`` column (``_has_task_path``)."""
    target._has_task_path = source._has_task_path


# --- langgraph-checkpoint-postgres 3.2.0 (shared/storage/postgres.py) -----------------------------


class PostgresWriteCursor:
    """Mixed in before ``AsyncPostgresSaver``: its writes (``aput``, ``aput_writes``) take their
    cursor from :meth:`write_cursor` instead of the saver's own.

    Every query of the saver takes its cursor from the private ``_cursor(pipeline=...)``:
    without a pipeline for reads, with one for the two writes. Reads keep the saver's own.
    """

    @asynccontextmanager
    async def _cursor(self, *, pipeline: bool = False) -> AsyncIterator[psycopg.AsyncCursor[DictRow]]:
        if not pipeline:
            async with super()._cursor() as cur:  # type: ignore[misc]  # AsyncPostgresSaver's, after this in the MRO
                yield cur
            return
        async with self.write_cursor() as cur:
            yield cur

    def write_cursor(self) -> AbstractAsyncContextManager[psycopg.AsyncCursor[DictRow]]:
        raise NotImplementedError


@asynccontextmanager
async def postgres_saver_connection(conn: Any) -> AsyncIterator[psycopg.AsyncConnection[DictRow]]:
    """A connection of the saver's ``conn`` (a pool's, held until the block ends, or the
    connection itself): ``langgraph.checkpoint.postgres._ainternal.get_connection``."""
    from langgraph.checkpoint.postgres import _ainternal

    async with _ainternal.get_connection(conn) as connection:
        yield connection


# --- httpx 0.29.0: a client's default transport (worker/tools/fetch_server.py) --------------------


def replace_default_transport(client: httpx.AsyncClient, transport: httpx.AsyncBaseTransport) -> None:
    """Route every request of ``client`` not mounted on a proxy through ``transport``
    (``AsyncClient._transport``): httpx lets no argument replace the default transport without
    also dropping the proxy mounts the environment asked for."""
    client._transport = transport
