"""Every reach of ``shared/`` (and so of the API) into another library's private names.

Each one here, and nowhere else, with the version it was read from; tests/fast/test_compat.py
fails when an installed library no longer has what is used (the name, its signature, or the
source of what is overridden). Whoever upgrades one of these libraries reads its new code
where that test points, brings the use here in line, and updates the version and the test.
The worker's reaches into arq's loop are in worker/queue/compat.py.

Nothing is imported until it is used: the API's main process imports this module (through
shared/speedups.py) and must load neither LangGraph, nor a database driver, nor the fetch
server by it.
"""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
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
    "langgraph-checkpoint": "4.3.2",
    "aiosqlite": "0.22.1",
    "langgraph-checkpoint-sqlite": "3.1.2",
    "langgraph-checkpoint-postgres": "3.2.0",
    "httpx": "0.29.0",
    "litestar": "2.25.0",
}


# --- redis-py 5.3.1: its reply parsers (shared/speedups.py) ----------------------------------
# A pool takes a parser class (``parser_class``), but the classes themselves are importable only
# from the private ``redis._parsers``.


def redis_parsers() -> tuple[type[Any], type[Any]]:
    """redis-py's asyncio reply parsers: (hiredis's, its own pure-Python RESP2 one)."""
    from redis._parsers import _AsyncHiredisParser, _AsyncRESP2Parser

    return _AsyncHiredisParser, _AsyncRESP2Parser


# --- litestar 2.25.0: the plugins every app is given (api/app.py) -------------------------------
# ``Litestar.__init__`` adds its default plugins by the private ``_get_default_plugins``, which
# imports pydantic's plugin (and pydantic, ~7 MB a process) whenever pydantic is installed, as it
# is for LangGraph: the API has no pydantic model, its types are msgspec's.


def litestar_without_pydantic() -> type[Any]:
    """``Litestar`` given its default plugins but pydantic's: msgspec's (dependencies) and attrs'
    (schemas), as ``Litestar._get_default_plugins`` adds them."""
    from contextlib import suppress

    from litestar import Litestar
    from litestar.exceptions import MissingDependencyException
    from litestar.plugins.core import MsgspecDIPlugin

    class App(Litestar):
        @staticmethod
        def _get_default_plugins(plugins: list[Any]) -> list[Any]:
            plugins.append(MsgspecDIPlugin())
            with suppress(MissingDependencyException):
                from litestar.plugins.attrs import AttrsSchemaPlugin

                if not any(isinstance(plugin, AttrsSchemaPlugin) for plugin in plugins):
                    plugins.append(AttrsSchemaPlugin())
            return plugins

    return App


# --- mcp-server-fetch 2026.10.10: its rule of a public address (shared/pinned.py) ----------------


def fetch_is_public_address(address: str) -> bool:
    """mcp-server-fetch's ``_is_public_address``: the fetch tool's own rule, which the pinned
    transport and webhooks apply too. The module costs about half a second to import."""
    from mcp_server_fetch.server import _is_public_address

    return bool(_is_public_address(address))


# --- langgraph 1.2.24: the batch reducer of a DeltaChannel of messages (shared/storage/threads/state.py) --


def messages_delta_reducer() -> Callable[[list[AnyMessage], list[list[AnyMessage]]], list[AnyMessage]]:
    """LangGraph's private, "experimental" ``_messages_delta_reducer``: it assigns no message ids;
    LangGraph's loop stamps them (``ensure_message_ids``) on every write to a DeltaChannel whose
    reducer is this very function, before the write is saved. So it must be this object."""
    from langgraph.graph.message import _messages_delta_reducer

    return _messages_delta_reducer


# --- langgraph-checkpoint 4.3.2: the strict serializer's decoding of msgpack ext values -----------
# (shared/storage/threads/decoding.py). ``JsonPlusSerializer`` takes another decoding as its
# ``__unpack_ext_hook__``; LangGraph's own, to fall back on, is made by ``_create_msgpack_ext_hook``.


ExtHook = Callable[[int, bytes], Any]


def strict_serializer_options(wrap: Callable[[ExtHook], ExtHook]) -> Any:
    """``JsonPlusSerializer``'s keyword arguments for strict deserialization (LangGraph's safe types
    only, whatever the environment says) whose msgpack ext values ``wrap(LangGraph's decoding of
    them)`` decodes."""
    from langgraph.checkpoint.serde.jsonplus import _create_msgpack_ext_hook

    return {"allowed_msgpack_modules": None, "__unpack_ext_hook__": wrap(_create_msgpack_ext_hook(None))}


# --- langgraph 1.2.24, langgraph-checkpoint 4.3.2: a thread's state without the graph runtime ----
# (shared/storage/threads/snapshot.py). Each is LangGraph's own, reached where it lives (the constants, the
# snapshot blob, the Overwrite test), or copied where its module would import ``langgraph.pregel``
# (the reducer, the task ids, the tasks' order): tests/fast/test_compat.py holds each copy to the
# original, on the same inputs.


def pregel_constants() -> Any:
    """LangGraph's reserved channel and task names (``langgraph._internal._constants``)."""
    from langgraph._internal import _constants

    return _constants


def lazy_delta_snapshot(decode: Callable[[], Any], length: int | None) -> Any:
    """A ``_DeltaSnapshot`` (LangGraph's private blob of a DeltaChannel's full value) whose
    ``value`` is ``decode()``, called on first access (shared/storage/threads/decoding.py), and
    whose ``length`` is the value's, if a list, read without decoding it (else None).

    LangGraph reads the blob only by ``isinstance(x, _DeltaSnapshot)`` and ``x.value``
    (``DeltaChannel.from_checkpoint``, ``BinaryOperatorAggregate.from_checkpoint``, the savers'
    ``put``, ``_msgpack_default``); the tuple's one item reads the value too. LangGraph decodes it
    from msgpack ext code ``EXT_DELTA_SNAPSHOT`` (7) as ``_DeltaSnapshot(unpackb(data))``:
    :func:`delta_snapshot_code`."""
    return _lazy_snapshot_type()(decode, length)


def delta_snapshot_code() -> int:
    """The msgpack ext code of a ``_DeltaSnapshot`` (``jsonplus.EXT_DELTA_SNAPSHOT``)."""
    from langgraph.checkpoint.serde.jsonplus import EXT_DELTA_SNAPSHOT

    return int(EXT_DELTA_SNAPSHOT)


_LAZY: list[type[Any]] = []


def _lazy_snapshot_type() -> type[Any]:
    if _LAZY:
        return _LAZY[0]
    from langgraph.checkpoint.serde.types import _DeltaSnapshot

    class LazyDeltaSnapshot(_DeltaSnapshot):
        """A ``_DeltaSnapshot`` decoded when its value is first read."""

        _decode: Callable[[], Any] | None
        _value: Any
        length: int | None

        def __new__(cls, decode: Callable[[], Any], length: int | None) -> LazyDeltaSnapshot:
            self = tuple.__new__(cls, (None,))
            self._decode, self._value, self.length = decode, None, length
            return self

        @property
        def decoded(self) -> bool:
            return self._decode is None

        @property
        def value(self) -> Any:
            if self._decode is not None:
                self._value, self._decode = self._decode(), None
            return self._value

        def __getitem__(self, index: Any) -> Any:
            return (self.value,)[index]

        def __iter__(self) -> Any:
            return iter((self.value,))

        def __eq__(self, other: object) -> bool:
            return tuple(self) == (tuple(other) if isinstance(other, tuple) else other)

        def __ne__(self, other: object) -> bool:
            return not self == other

        def __hash__(self) -> int:
            return hash(tuple(self))

        def __repr__(self) -> str:
            return f"_DeltaSnapshot(value={self.value!r})"

        def __reduce__(self) -> Any:
            return (_DeltaSnapshot, (self.value,))

    _LAZY.append(LazyDeltaSnapshot)
    return LazyDeltaSnapshot


def __getattr__(name: str) -> Any:
    # ``DeltaSnapshot`` (a type, for isinstance): LangGraph's private ``_DeltaSnapshot``, the blob
    # of a DeltaChannel's full value, imported when first named.
    if name == "DeltaSnapshot":
        from langgraph.checkpoint.serde.types import _DeltaSnapshot

        return _DeltaSnapshot
    raise AttributeError(name)


def overwrite_of(value: Any) -> tuple[bool, Any]:
    """Whether a write replaces the channel's value, and with what (``binop._get_overwrite``,
    copied: its module imports ``langgraph.types`` and with it ``langchain_core.runnables``,
    langsmith and OpenTelemetry, ~18 MB a reader process). An ``Overwrite`` exists only once
    ``langgraph.types`` is imported (decoding one imports it), so it is looked for only then."""
    types = sys.modules.get("langgraph.types")
    if types is not None and isinstance(value, types.Overwrite):
        return True, value.value
    if isinstance(value, dict):
        mark = pregel_constants().OVERWRITE
        if len(value) == 1 and mark in value:
            return True, value[mark]
        if value.get("type") == mark and "value" in value:
            return True, value["value"]
    return False, None


def task_id(checkpoint_id: bytes, *parts: str) -> str:
    """A task's id as LangGraph makes it for a checkpoint of format 2 or later
    (``pregel._algo._xxhash_str``): the XXH3-128 of the checkpoint's id and the parts, as a UUID."""
    from xxhash import xxh3_128_hexdigest

    hexed = xxh3_128_hexdigest(checkpoint_id + b"".join(p.encode() for p in parts))
    return f"{hexed[:8]}-{hexed[8:12]}-{hexed[12:16]}-{hexed[16:20]}-{hexed[20:32]}"


def task_path_str(path: str | int | tuple[Any, ...]) -> str:
    """The key LangGraph orders a step's tasks by when it applies their writes
    (``pregel._algo.task_path_str``)."""
    if isinstance(path, (tuple, list)):
        return f"~{', '.join(task_path_str(x) for x in path)}"
    return f"{path:010d}" if isinstance(path, int) else str(path)


def graph_snapshot(graph: Any, saved: Any, saver: Any) -> Any:
    """LangGraph's own snapshot of one listed checkpoint, as ``get_state_history`` builds each
    (``Pregel._prepare_state_snapshot``): what shared/storage/threads/snapshot.py falls back to."""
    return graph._prepare_state_snapshot(saved.config, saved, saver=saver)


def messages_delta_reduce(state: list[Any], writes: list[Any]) -> list[Any]:
    """LangGraph's ``_messages_delta_reducer`` (``pregel._messages``), applied: ``state`` after
    ``writes``, deduplicated by id, ``RemoveMessage`` tombstones, ``REMOVE_ALL_MESSAGES`` resets."""
    from langchain_core.messages import BaseMessage, RemoveMessage
    from langchain_core.messages.utils import convert_to_messages

    flat: list[Any] = []
    for write in writes:
        if isinstance(write, list):
            flat.extend(write)
        else:
            flat.append(write)
    state_msgs = state if state and isinstance(state[0], BaseMessage) else convert_to_messages(state)
    msgs = convert_to_messages(flat)
    for idx in range(len(msgs) - 1, -1, -1):
        m = msgs[idx]
        if isinstance(m, RemoveMessage) and m.id == "__remove_all__":
            state_msgs = []
            msgs = msgs[idx + 1 :]
            break
    index: dict[str, int] = {m.id: i for i, m in enumerate(state_msgs) if m.id is not None}
    result: list[Any] = list(state_msgs)
    for msg in msgs:
        mid = msg.id
        if mid is None:
            result.append(msg)
        elif isinstance(msg, RemoveMessage):
            if mid in index:
                result[index[mid]] = None
                del index[mid]
        elif mid in index:
            result[index[mid]] = msg
        else:
            index[mid] = len(result)
            result.append(msg)
    return [m for m in result if m is not None]


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


# --- langgraph-checkpoint-postgres 3.2.0: its tables read directly (shared/storage/threads/listing.py) --
# ``PostgresSaver.list`` selects each checkpoint with every stored value of every channel it names
# (``SELECT_SQL``: ``checkpoint_blobs`` joined on the checkpoint's ``channel_versions``, a hash of
# all the thread's values built again for each checkpoint) and its writes, then builds each tuple
# with the private ``_load_checkpoint_tuple``. :func:`postgres_listing` selects the same
# checkpoints and writes (the same SQL, less the values), then the keys and heads (first bytes) of
# the values they name, then only the values ``wanted``, in one repeatable-read transaction; the
# rest it leaves out of the tuples, for the caller to read (:func:`postgres_stored_value`) or not.

#: ``SELECT_SQL`` but its ``channel_values`` column (tests/fast/test_compat.py compares the two,
#: whitespace aside)
POSTGRES_CHECKPOINTS_SQL = """
select
    thread_id,
    checkpoint,
    checkpoint_ns,
    checkpoint_id,
    parent_checkpoint_id,
    metadata,
    (
        select
        array_agg(array[cw.task_id::text::bytea, cw.channel::bytea, cw.type::bytea, cw.blob,
            convert_to(cw.task_path, 'UTF8'), cw.idx::text::bytea])
        from checkpoint_writes cw
        where cw.thread_id = checkpoints.thread_id
            and cw.checkpoint_ns = checkpoints.checkpoint_ns
            and cw.checkpoint_id = checkpoints.checkpoint_id
    ) as pending_writes
from checkpoints """

#: the stored values of the keys given (four arrays: threads, namespaces, channels, versions);
#: ``{}``: each whole (``blob``) or its first bytes (``substring(blob from 1 for 16)``)
_POSTGRES_VALUES_SQL = """
select bl.thread_id, bl.checkpoint_ns, bl.channel, bl.version, bl.type, {} as blob
from unnest(%s::text[], %s::text[], %s::text[], %s::text[]) as k(thread_id, checkpoint_ns, channel, version)
join checkpoint_blobs bl
    on bl.thread_id = k.thread_id and bl.checkpoint_ns = k.checkpoint_ns
    and bl.channel = k.channel and bl.version = k.version
"""
#: how many first bytes of a value :func:`postgres_listing` shows ``wanted``
POSTGRES_HEAD = 16

#: a stored value's key: (thread, namespace, channel, version)
StoredKey = tuple[str, str, str, str]


def postgres_listing(
    saver: Any, config: Any, *, filter: dict[str, Any] | None, before: Any, limit: int | None,
    wanted: Callable[[str, bytes | None], bool],
) -> list[tuple[Any, dict[str, tuple[StoredKey, str, bytes | None]]]] | None:
    """What ``PostgresSaver.list(config, filter=, before=, limit=)`` lists, newest first, each
    checkpoint's tuple with only the stored values ``wanted(type, head)`` says to read, and by
    channel the key, type and head of each value left out (its tuple has the inline value there,
    if any: the caller sets what it reads instead). None where the saver's own listing must be
    used: a checkpoint of a format before 4 with a parent (its Sends are its parent's writes)."""
    where, params = saver._search_where(config, filter, before)
    query = POSTGRES_CHECKPOINTS_SQL + where + " ORDER BY checkpoint_id DESC"
    if limit is not None:
        query += " LIMIT %s"
        params = [*params, int(limit)]
    with _postgres_snapshot(saver) as cur:
        cur.execute(query, params)
        rows = cur.fetchall()
        if any(row["checkpoint"]["v"] < 4 and row["parent_checkpoint_id"] for row in rows):
            return None
        named = {key for row in rows for key in _stored_keys(row)}
        heads = _postgres_values(cur, named, f"substring(bl.blob from 1 for {POSTGRES_HEAD})")
        read = {key for key, (kind, head) in heads.items() if wanted(kind, head)}
        values = _postgres_values(cur, read, "bl.blob")
    listed = []
    for row in rows:
        keys = [(key, key[2]) for key in _stored_keys(row) if key in heads]
        row["channel_values"] = [
            (channel.encode(), values[key][0].encode(), values[key][1])
            for key, channel in keys if key in values
        ]
        left = {channel: (key, *heads[key]) for key, channel in keys if key not in values}
        listed.append((saver._load_checkpoint_tuple(row), left))
    return listed


def postgres_stored_value(saver: Any, key: StoredKey) -> tuple[str, bytes | None] | None:
    """The stored value of ``key`` (its type and bytes), None if there is none (any more)."""
    with saver._cursor() as cur:
        return _postgres_values(cur, {key}, "bl.blob").get(key)


def _stored_keys(row: Any) -> list[StoredKey]:
    thread, namespace = row["thread_id"], row["checkpoint_ns"]
    return [(thread, namespace, c, v) for c, v in row["checkpoint"]["channel_versions"].items()]


def _postgres_values(
    cur: Any, keys: set[StoredKey], column: str
) -> dict[StoredKey, tuple[str, bytes | None]]:
    if not keys:
        return {}
    cur.execute(_POSTGRES_VALUES_SQL.format(column), [list(part) for part in zip(*keys, strict=True)])
    return {
        (r["thread_id"], r["checkpoint_ns"], r["channel"], r["version"]): (r["type"], r["blob"])
        for r in cur.fetchall()
    }


@contextmanager
def _postgres_snapshot(saver: Any) -> Iterator[Any]:
    """The saver's cursor (its lock held) in one transaction that reads one snapshot: a
    repeatable-read one of its own, or the connection's own transaction if one is open."""
    from psycopg.pq import TransactionStatus

    with saver._cursor() as cur:
        conn = cur.connection
        idle = conn.info.transaction_status == TransactionStatus.IDLE
        with conn.transaction():
            if idle:
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            yield cur


# --- httpx 0.29.0: a client's default transport (worker/tools/fetch_server.py) --------------------


def replace_default_transport(client: httpx.AsyncClient, transport: httpx.AsyncBaseTransport) -> None:
    """Route every request of ``client`` not mounted on a proxy through ``transport``
    (``AsyncClient._transport``): httpx lets no argument replace the default transport without
    also dropping the proxy mounts the environment asked for."""
    client._transport = transport
