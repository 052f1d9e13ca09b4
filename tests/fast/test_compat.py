"""What shared/compat.py and worker/queue/compat.py reach for in other libraries is still there.

Each reach into a private name is checked here, so an upgrade of that library fails here first:
the installed version is the one the use was read from, the name is there with the signature
used, and where our code copies or replaces a library's code (arq's ``start_jobs``, the
postgres saver's write cursor) its source hashes to what it was when that was written.
Behaviour is tested where it matters: tests/fast/test_sqlite_saver.py (one hop per call),
tests/test_arq_contract.py (the worker takes the jobs arq's would), tests/test_postgres.py.
No product module outside the two compat modules names another library's private name.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import hashlib
import inspect
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from shared import compat
from tests.support.http import async_http_client
from worker.queue import compat as worker_compat

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("api", "worker", "shared", "sophos_cli")
COMPAT_MODULES = {ROOT / "shared" / "compat.py", ROOT / "worker" / "queue" / "compat.py"}


def _sha256(obj: Any) -> str:
    return hashlib.sha256(inspect.getsource(obj).encode()).hexdigest()


@pytest.mark.parametrize("library", sorted({**compat.READ_FROM, **worker_compat.READ_FROM}))
def test_each_library_is_the_version_its_private_names_were_read_from(library: str) -> None:
    expected = {**compat.READ_FROM, **worker_compat.READ_FROM}[library]
    assert version(library) == expected, (
        f"{library} {version(library)} is installed, its private names were read from {expected}: "
        "read its new code where tests/fast/test_compat.py points, then update READ_FROM"
    )


def test_redis_parsers() -> None:
    from redis._parsers import _AsyncHiredisParser, _AsyncRESP2Parser

    assert compat.redis_parsers() == (_AsyncHiredisParser, _AsyncRESP2Parser)


def test_the_fetch_servers_rule_of_a_public_address() -> None:
    from mcp_server_fetch.server import _is_public_address

    assert list(inspect.signature(_is_public_address).parameters) == ["address"]
    assert compat.fetch_is_public_address("8.8.8.8") and not compat.fetch_is_public_address("127.0.0.1")


def test_langgraphs_messages_delta_reducer() -> None:
    from langgraph.graph.message import _messages_delta_reducer

    assert compat.messages_delta_reducer() is _messages_delta_reducer  # the very object (see there)
    assert list(inspect.signature(_messages_delta_reducer).parameters) == ["state", "writes"]


def test_the_serializers_ext_hook() -> None:
    """The strict serializer's own decoding of ext values, wrapped (shared/storage/threads/decoding.py):
    what it is given is what it decodes with, and LangGraph's decoding passed in is the strict one."""
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer, _create_msgpack_ext_hook
    from langgraph.types import Send

    assert list(inspect.signature(_create_msgpack_ext_hook).parameters) == ["allowed_modules"]
    assert "__unpack_ext_hook__" in inspect.signature(JsonPlusSerializer.__init__).parameters
    given: list[Any] = []

    def wrap(hook: Any) -> Any:
        given.append(hook)
        return lambda code, data: ("ours", hook(code, data))

    serde = JsonPlusSerializer(**compat.strict_serializer_options(wrap))
    sent = Send("tools", {"a": 1})
    assert serde.loads_typed(serde.dumps_typed([sent])) == [("ours", sent)]
    # Strict: a type outside LangGraph's safe ones is not built, its data is given back.
    blocked = serde.dumps_typed(_Unlisted(1))
    assert given[0](*_ext_of(blocked[1])) == {"a": 1}


def test_a_delta_snapshot_decoded_when_read_is_langgraphs() -> None:
    """A DeltaChannel's full copy decoded on first read (shared/storage/threads/decoding.py): its
    ext code is the one LangGraph writes it with and decodes it from, and LangGraph takes it as
    its own ``_DeltaSnapshot`` (the channel restored from it, the blob written again the same)."""
    import ormsgpack
    from langchain_core.messages import AIMessage, HumanMessage
    from langgraph.channels.delta import DeltaChannel
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer, _create_msgpack_ext_hook
    from langgraph.checkpoint.serde.types import _DeltaSnapshot

    messages = [HumanMessage("a", id="1"), AIMessage("b", id="2")]
    eager = JsonPlusSerializer(allowed_msgpack_modules=None)
    kind, blob = eager.dumps_typed(_DeltaSnapshot(messages))
    code, data = _ext_of(blob)
    assert code == compat.delta_snapshot_code()
    assert _create_msgpack_ext_hook(None)(code, data) == _DeltaSnapshot(messages)
    calls: list[int] = []

    def decode() -> Any:
        calls.append(1)
        return ormsgpack.unpackb(data, ext_hook=_create_msgpack_ext_hook(None))

    lazy = compat.lazy_delta_snapshot(decode, 2)
    assert isinstance(lazy, _DeltaSnapshot) and lazy.length == 2 and not lazy.decoded and calls == []
    channel = DeltaChannel(compat.messages_delta_reducer()).from_checkpoint(lazy)
    assert channel.get() == messages and lazy.decoded and calls == [1]
    assert lazy.value is lazy.value and calls == [1]  # decoded once
    assert lazy == _DeltaSnapshot(messages) and list(lazy) == [messages] and lazy[0] == messages
    assert eager.dumps_typed(lazy) == (kind, blob)
    assert repr(lazy) == repr(_DeltaSnapshot(messages))


@dataclasses.dataclass
class _Unlisted:
    """A type strict deserialization does not build (not among LangGraph's safe ones)."""

    a: int


def _ext_of(data: bytes) -> tuple[int, bytes]:
    import ormsgpack

    found: list[tuple[int, bytes]] = []
    ormsgpack.unpackb(data, ext_hook=lambda code, payload: found.append((code, payload)))
    return found[0]


def test_litestars_default_plugins() -> None:
    """``litestar_without_pydantic`` adds Litestar's default plugins but pydantic's, as
    ``Litestar._get_default_plugins`` adds them: a change there is read before the hash is updated."""
    from litestar.app import Litestar
    from litestar.plugins.attrs import AttrsSchemaPlugin
    from litestar.plugins.core import MsgspecDIPlugin

    assert _sha256(Litestar._get_default_plugins) == (
        "c7c40d6d9bec4bd91223750b295841f9291dc2d66a543deb36d1a0b9d1da210b"
    ), "Litestar._get_default_plugins changed: compare it with shared/compat.py litestar_without_pydantic"
    app = compat.litestar_without_pydantic()()
    assert {type(p) for p in app.plugins if isinstance(p, (MsgspecDIPlugin, AttrsSchemaPlugin))} == {
        MsgspecDIPlugin, AttrsSchemaPlugin,
    }
    assert not [p for p in app.plugins if "pydantic" in type(p).__module__]


def test_aiosqlite_and_the_sqlite_savers_private_names() -> None:
    import aiosqlite
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    execute = inspect.signature(aiosqlite.Connection._execute)
    assert list(execute.parameters) == ["self", "fn", "args", "kwargs"]
    assert "self._conn" in inspect.getsource(aiosqlite.Connection.__init__)
    for saver in (SqliteSaver, AsyncSqliteSaver):
        assert saver._has_task_path is True  # the class default, changed by setup() on an old table


def test_the_postgres_savers_cursor_and_connection() -> None:
    from langgraph.checkpoint.postgres import _ainternal
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    assert list(inspect.signature(_ainternal.get_connection).parameters) == ["conn"]
    assert list(inspect.signature(AsyncPostgresSaver._cursor).parameters) == ["self", "pipeline"]
    # PostgresWriteCursor replaces its pipeline branch (the writes) whole: a change there is
    # read before the hash is updated
    assert _sha256(AsyncPostgresSaver._cursor) == (
        "217e0ac4b09b8778932a99010dabf9f3add7b103e06c39b23606d52523a25bc3"
    ), "AsyncPostgresSaver._cursor changed: compare it with shared/compat.py PostgresWriteCursor"


#: the postgres saver's code the listing of our own (shared/compat.py ``postgres_listing``) is
#: read from, or calls: a change in any is read there before the hash is updated
POSTGRES_LISTING_SOURCE_HASHES = {
    "PostgresSaver.list": "bfbfaf061d1a11e7f617d9fc10096d2d2ec63e583edf95e31d07bb727a8be3c8",
    "PostgresSaver._load_checkpoint_tuple": (
        "668ab75160e0104b9c55bb94814d536a47daa21cbeab657c896400c36ab9ff51"
    ),
    "PostgresSaver._load_blobs": "61f019778911621d424b2fa692b1aa821eccbe034e716f19e7e224ac247bef4c",
    "PostgresSaver._load_writes": "24ba219534a7839c40bce63dbbb152dec490dcb9c4087d14e81106bef13d53f4",
    "PostgresSaver._search_where": "3d346321306bc45bec30c9a2496053b64d4a03f551b9f5da4e6fda0a09ecedc3",
    "PostgresSaver._cursor": "3e7f6f63d0285f7e81926cf8a14f5f779568a35efaeba52823b653b366ec72d7",
}
#: the tables, as the saver's migrations make them (``MIGRATIONS``, joined)
POSTGRES_TABLES_HASH = "b61d83ce19b67141d851d7fa29a73ecc6f5cd8e9d45c1aa0f6b6f9ebe50f26bf"


@pytest.mark.parametrize("name", sorted(POSTGRES_LISTING_SOURCE_HASHES))
def test_the_postgres_saver_code_the_listing_reads_is_unchanged(name: str) -> None:
    from langgraph.checkpoint.postgres import PostgresSaver

    found = _sha256(getattr(PostgresSaver, name.partition(".")[2]))
    assert found == POSTGRES_LISTING_SOURCE_HASHES[name], (
        f"LangGraph's {name} changed: compare it with shared/compat.py postgres_listing"
    )


def test_the_postgres_savers_tables_and_query_are_the_listings() -> None:
    """The listing selects what the saver's ``SELECT_SQL`` selects but the stored values, from
    the tables the saver's migrations make."""
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.checkpoint.postgres.base import MIGRATIONS, SELECT_SQL

    assert hashlib.sha256("\n".join(MIGRATIONS).encode()).hexdigest() == POSTGRES_TABLES_HASH, (
        "LangGraph's checkpoint tables changed: compare them with shared/compat.py postgres_listing"
    )
    start = SELECT_SQL.index("    (\n        select array_agg(array[bl.")
    values = SELECT_SQL[start : SELECT_SQL.index("    (\n        select\n")]
    assert values.rstrip().endswith(") as channel_values,")
    assert PostgresSaver.SELECT_SQL == SELECT_SQL
    words = " ".join(SELECT_SQL.replace(values, "").split())
    assert words == " ".join(compat.POSTGRES_CHECKPOINTS_SQL.split())


def test_a_stored_copys_head_tells_it_and_its_length() -> None:
    """What the listing reads of a stored value's first bytes (shared/storage/threads/decoding.py
    ``snapshot_head``) is what decoding the whole value gives: a full copy, of that length."""
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
    from langgraph.checkpoint.serde.types import _DeltaSnapshot

    from shared.storage.threads.decoding import DecodedOnce, snapshot_head

    eager = JsonPlusSerializer(allowed_msgpack_modules=None)
    lists = ([], [1], ["x" * 300], ["m"] * 15, ["m"] * 16, ["m" * 20] * 3000, [0] * 70_000)
    for value in (*lists, {"a": 1}, "t"):
        kind, blob = eager.dumps_typed(_DeltaSnapshot(value))
        lazy = DecodedOnce().loads_typed((kind, blob))
        head = blob[: compat.POSTGRES_HEAD]
        assert snapshot_head(kind, head) == (True, lazy.length), value
        assert snapshot_head(kind, head)[1] == (len(value) if isinstance(value, list) else None)
        assert snapshot_head(*eager.dumps_typed(value)) == (False, None)
    assert snapshot_head("empty", None) == (False, None)
    assert snapshot_head("bytes", eager.dumps_typed(_DeltaSnapshot([1]))[1]) == (False, None)


def test_an_httpx_clients_default_transport() -> None:
    import httpx

    client = async_http_client()
    assert isinstance(client._transport, httpx.AsyncHTTPTransport)
    replacement = httpx.AsyncHTTPTransport()
    compat.replace_default_transport(client, replacement)
    assert client._transport_for_url(httpx.URL("https://example.com/")) is replacement


#: sha256 of ``inspect.getsource`` of each arq method, as of arq 0.28.0
ARQ_SOURCE_HASHES = {
    # copied by HookedWorker.start_jobs
    "start_jobs": "b45797cfa40bed7fe6e9b8b8100c5f5b4144fe85112155c4e355df6ed8521f5f",
    # called through super() by HookedWorker._poll_iteration: reads the queue, calls start_jobs
    "_poll_iteration": "f8d39d823a0a59f27a45f1c0e80bee44e16219d5072235fbc81866402298322f",
    # the done-callback the copy attaches to each job's task
    "_release_sem_dec_counter_on_complete": (
        "0ed101482e942c33a64ccbe19eb3c4d29da9497258b1ffb1380da300da9bc481"
    ),
}


@pytest.mark.parametrize("name", sorted(ARQ_SOURCE_HASHES))
def test_the_arq_code_the_hooked_worker_copies_is_unchanged(name: str) -> None:
    from arq.worker import Worker

    assert _sha256(getattr(Worker, name)) == ARQ_SOURCE_HASHES[name], (
        f"arq's Worker.{name} changed: compare it with HookedWorker (worker/queue/compat.py)"
    )

#: What shared/storage/threads/snapshot.py rebuilds, and the functions of LangGraph it copies
#: (shared/compat.py: the reducer, the task ids, the tasks' order): a change to any means the
#: state it reads may no longer be LangGraph's; tests/fast/test_snapshot.py compares the two.
SNAPSHOT_SOURCE_HASHES = {
    "langgraph.channels.binop:_get_overwrite": (
        "03bf9bd15219d307c4de64b0cdbbc8d5e89ef890b08a3435f03b40bf18722ba2"
    ),
    "langgraph.pregel._messages:_messages_delta_reducer": (
        "7f2d5a490973b66eba64c096f9f7b2c06a53a66db65899362072a73e4aa4e06d"
    ),
    "langgraph.pregel._algo:_xxhash_str": (
        "bbc494c5d66e5b9d1a9a5361e77f74d02a6e6d0725cb160efc28cf3dd7bfbdad"
    ),
    "langgraph.pregel._algo:task_path_str": (
        "58210320ff743f51ed6aeffbe7e9b4a666ab4f91ad2578a5fba1a60f4bc29686"
    ),
    "langgraph.pregel._algo:prepare_next_tasks": (
        "4c6acc7b9dea513b276a524ce20f34243cad5e5877883036cc67dff1340d58b8"
    ),
    "langgraph.pregel._algo:prepare_single_task": (
        "ef2afec2a91cef2b835df6f6e352ad88fcfea9734fdf6200e5459c863803242b"
    ),
    "langgraph.pregel._algo:prepare_push_task_send": (
        "0e151e80a5cb074272aa919c759bdec838def12b7eff49f25a74fb1d7f083f68"
    ),
    "langgraph.pregel._algo:_triggers": (
        "8072b87282f761f183cee3f54766f11bc21b9f7eef90212fdcc3115172185b8e"
    ),
    "langgraph.pregel._algo:apply_writes": (
        "269c92665d99defd7516bb401729bb0d83256fa3bd9e33d2806d49e5b237a69b"
    ),
    "langgraph.pregel._task_status:read_task_statuses": (
        "13db37cfd5b4073d6184487f79e0ab429dfa80db60efc0b90dd48c0b05fd3f77"
    ),
    "langgraph.pregel.debug:tasks_w_writes": (
        "f9fe719a07543d5bc36f61b3cb84062fa7fb71bd57d4b88dd7695ecd88ea5da6"
    ),
    "langgraph.pregel.debug:map_task_result_writes": (
        "0331578fc2639cb65ce3d27fb9fd2cfcf4da4b31f921fde741bffc3c1f3d8492"
    ),
    "langgraph.pregel._checkpoint:channels_from_checkpoint": (
        "e5a026c55dd21f514635f13ea344d775f7011f91459977596c57f13844bc4468"
    ),
    "langgraph.pregel.main:Pregel._prepare_state_snapshot": (
        "46264a767b5f5142c027ebf31c160dc97d16428dc0fd340eeb2fb56d9477acd6"
    ),
    "langgraph.pregel.main:Pregel.get_state": (
        "f1e8b365f0f8b7638d0c477c058cc104aa602880241eaceef38ed7ad852f7182"
    ),
    "langgraph.pregel.main:Pregel.get_state_history": (
        "9a6b27308ed7acdf175355ee84edbe9ce9fac66f8d7063c26dc99b123472875e"
    ),
    "langgraph._internal._config:patch_checkpoint_map": (
        "98c95d5be2113d9b9bcf94ecc019d9f78baa390e170e8ead640982d97e9416ad"
    ),
}


@pytest.mark.parametrize("name", sorted(SNAPSHOT_SOURCE_HASHES))
def test_the_langgraph_code_the_thread_snapshot_mirrors_is_unchanged(name: str) -> None:
    import importlib

    module, _, path = name.partition(":")
    obj: Any = importlib.import_module(module)
    for part in path.split("."):
        obj = getattr(obj, part)
    assert _sha256(obj) == SNAPSHOT_SOURCE_HASHES[name], (
        f"LangGraph's {name} changed: compare it with shared/storage/threads/snapshot.py and shared/compat.py"
    )


def test_the_copies_do_what_langgraphs_originals_do() -> None:
    from langchain_core.messages import AIMessage, HumanMessage, RemoveMessage
    from langgraph.checkpoint.serde.types import _DeltaSnapshot
    from langgraph.pregel._algo import _xxhash_str, task_path_str
    from langgraph.pregel._messages import _messages_delta_reducer
    from langgraph.types import Overwrite

    state = [HumanMessage("a", id="1"), AIMessage("b", id="2")]
    for writes in (
        [[AIMessage("b2", id="2")], [HumanMessage("c", id="3")]],
        [[RemoveMessage(id="1")], {"role": "user", "content": "d", "id": "4"}],
        [[HumanMessage("e", id="5"), RemoveMessage(id="__remove_all__"), AIMessage("f", id="6")]],
        [[AIMessage("no id")]],
    ):
        ours = compat.messages_delta_reduce(list(state), writes)
        assert ours == _messages_delta_reducer(list(state), writes)
    assert compat.messages_delta_reduce([], [[{"role": "user", "content": "x", "id": "9"}]]) == (
        _messages_delta_reducer([], [[{"role": "user", "content": "x", "id": "9"}]])
    )
    ident = bytes.fromhex("1ef4f797c3f06b2c8001a1b2c3d4e5f6")
    parts = ("tools", "3", "tools", "__pregel_push", "1")
    assert compat.task_id(ident, *parts) == _xxhash_str(ident, *parts)
    for path in (("__pregel_push", 1, False), ("__pregel_pull", "agent"), (), ("a", (2, "b"))):
        assert compat.task_path_str(path) == task_path_str(path)
    assert compat.overwrite_of(Overwrite([1])) == (True, [1])
    assert compat.overwrite_of({"__overwrite__": [2]}) == (True, [2])
    assert compat.overwrite_of({"type": "__overwrite__", "value": [3]}) == (True, [3])
    assert compat.overwrite_of({"type": "__overwrite__"}) == (False, None)
    assert compat.overwrite_of([HumanMessage("x")]) == (False, None)
    assert compat.DeltaSnapshot is _DeltaSnapshot
    constants = compat.pregel_constants()
    assert (constants.TASKS, constants.PUSH, constants.PULL, constants.NULL_TASK_ID) == (
        "__pregel_tasks", "__pregel_push", "__pregel_pull", "00000000-0000-0000-0000-000000000000",
    )
    c = constants
    named = (c.ERROR, c.INTERRUPT, c.RESUME, c.RETURN, c.ERROR_SOURCE_NODE)
    assert named == ("__error__", "__interrupt__", "__resume__", "__return__", "__error_source_node__")


async def _job(ctx: dict[str, Any]) -> None:
    return None


def test_the_arq_names_the_hooked_worker_uses_are_there() -> None:
    from arq.constants import in_progress_key_prefix
    from arq.worker import Worker, func

    assert in_progress_key_prefix == "arq:in-progress:"
    assert list(inspect.signature(Worker.run_job).parameters) == ["self", "job_id", "score"]
    assert list(inspect.signature(Worker.start_jobs).parameters) == ["self", "job_ids"]
    worker = Worker(functions=[func(_job, name="job")], redis_pool=None, queue_name="q", handle_signals=False)
    for attribute in ("sem", "job_counter", "max_jobs", "in_progress_timeout_s", "queue_name", "tasks",
                      "loop", "allow_pick_jobs", "_pool"):
        assert hasattr(worker, attribute), attribute
    assert isinstance(worker.sem, asyncio.BoundedSemaphore)


def _private_reaches(tree: ast.Module) -> list[str]:
    """``x._name`` where ``x`` is not ``self``/``cls``/``super()``, and imports of ``_name``
    or of a private module: what a module reaches for in code that is not its own."""
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                and node.attr not in _defined_in(tree)):
            owner = ast.unparse(node.value)
            if owner not in ("self", "cls", "super()", "os") and not owner.startswith("self."):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            private_module = any(p.startswith("_") and p != "__future__" for p in node.module.split("."))
            private_names = [a.name for a in node.names if a.name.startswith("_")]
            if private_module or private_names:
                names = ", ".join(a.name for a in node.names)
                found.append(f"{node.lineno}: from {node.module} import {names}")
    return found


def _defined_in(tree: ast.Module) -> set[str]:
    """The names a module defines itself (functions, classes, attributes it assigns)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def test_no_other_product_module_reaches_for_a_private_name() -> None:
    reaching = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path in COMPAT_MODULES:
                continue
            # Names of our own (a module's ``_helper``, another of our objects' ``_field``) are
            # ours to change: only other libraries' count.
            found = [r for r in _private_reaches(ast.parse(path.read_text())) if not _ours(r)]
            if found:
                reaching[str(path.relative_to(ROOT))] = found
    assert reaching == {}, "move these into shared/compat.py or worker/queue/compat.py"


def _ours(reach: str) -> bool:
    return any(f"from {p}" in reach for p in PACKAGES)


def test_the_finder_sees_a_reach() -> None:
    source = "from redis._parsers import X\nconn._execute(f)\nself._x = 1\nother._x\ndef _f(): ...\nm._f()"
    assert _private_reaches(ast.parse(source)) == ["1: from redis._parsers import X", "2: conn._execute"]
