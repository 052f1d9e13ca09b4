"""What shared/compat.py and worker/compat.py reach for in other libraries is still there.

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
import hashlib
import inspect
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from shared import compat
from worker import compat as worker_compat

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("api", "worker", "shared", "sophos_cli")
COMPAT_MODULES = {ROOT / "shared" / "compat.py", ROOT / "worker" / "compat.py"}


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


def test_an_httpx_clients_default_transport() -> None:
    import httpx

    client = httpx.AsyncClient()
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
        f"arq's Worker.{name} changed: compare it with HookedWorker (worker/compat.py)"
    )


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
    assert reaching == {}, "move these into shared/compat.py or worker/compat.py"


def _ours(reach: str) -> bool:
    return any(f"from {p}" in reach for p in PACKAGES)


def test_the_finder_sees_a_reach() -> None:
    source = "from redis._parsers import X\nconn._execute(f)\nself._x = 1\nother._x\ndef _f(): ...\nm._f()"
    assert _private_reaches(ast.parse(source)) == ["1: from redis._parsers import X", "2: conn._execute"]
