"""One storage interface on both sides (issue 27, part 2): which engine runs is asked only in
shared/storage (shared/storage/engines.py), never by the API or the worker.

Read from the source tree: no module outside the storage package imports an engine's driver
or LangGraph's saver for an engine, or looks at ``database_url`` to choose one.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("api", "worker", "shared", "sophos_cli")
STORAGE = ROOT / "shared" / "storage"
#: the drivers and savers of one engine or the other
ENGINE_MODULES = (
    "aiosqlite", "sqlite3", "psycopg", "psycopg_pool",
    "langgraph.checkpoint.sqlite", "langgraph.checkpoint.postgres",
)
#: settings read the variable; the storage package decides with it
ASKS_ALLOWED = {ROOT / "shared" / "settings.py"}
#: ``python -m worker --copy-to``: copies a SQLite file into PostgreSQL, so it is both engines
#: by its nature (and runs instead of the worker, not beside it)
BOTH_ENGINES = {
    ROOT / "worker" / "upkeep" / "copy.py",
    # every reach into another library's private names, the engines' among them (on behalf of
    # shared/storage's savers, which alone use them)
    ROOT / "shared" / "compat.py",
}


def modules() -> Iterator[tuple[Path, ast.Module]]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if STORAGE in path.parents or path in BOTH_ENGINES:
                continue
            yield path, ast.parse(path.read_text(), filename=str(path))


def _engine(name: str) -> bool:
    return any(name == m or name.startswith(f"{m}.") for m in ENGINE_MODULES)


def test_no_module_outside_storage_imports_an_engine() -> None:
    found = []
    for path, tree in modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            else:
                continue
            found += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names if _engine(n)]
    assert found == []


def test_no_module_outside_storage_chooses_an_engine_by_its_url() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path, tree in modules()
        if path not in ASKS_ALLOWED
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr == "database_url"
    ]
    assert found == []


def test_the_check_sees_what_it_looks_for() -> None:
    """The walk reads the tree (it would pass on an empty one): the storage package itself
    imports both engines and asks for the URL."""
    engines = STORAGE / "engines.py"
    tree = ast.parse(engines.read_text())
    assert any(isinstance(n, ast.Attribute) and n.attr == "database_url" for n in ast.walk(tree))
    assert sum(1 for _ in modules()) > 50
