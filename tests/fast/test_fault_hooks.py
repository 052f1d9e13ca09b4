"""The fault hooks are test code (issue 39, part 3): the product keeps only the hook point.

The worker's hook point (worker/faults.py) loads tests/support/fault_hooks.py only when a
``SOPHOS_FAULT_*`` setting asks for a fault; no product module imports the tests or kills its
own process, so what is installed holds no test logic.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from shared.settings import Settings
from worker import faults

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("api", "worker", "shared", "sophos_cli")


def _product_modules() -> list[tuple[Path, ast.Module]]:
    return [
        (path, ast.parse(path.read_text(), filename=str(path)))
        for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
    ]


def test_no_product_module_imports_the_tests() -> None:
    importing = []
    for path, tree in _product_modules():
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            )
            importing += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] == "tests"]
    assert importing == []


def test_no_product_module_kills_its_own_process() -> None:
    killing = []
    for path, tree in _product_modules():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and ast.unparse(node.func) == "os.kill"
                    and any(ast.unparse(a) == "os.getpid()" for a in node.args)):
                killing.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert killing == [], "a fault hook in product code: it belongs in tests/support/fault_hooks.py"


def test_no_fault_asked_loads_no_test_code() -> None:
    sys.modules.pop(faults.HOOKS_MODULE, None)
    assert faults.load(Settings()) == faults.Faults()
    assert faults.HOOKS_MODULE not in sys.modules


def test_a_fault_asked_loads_its_hooks_from_the_tests() -> None:
    loaded = faults.load(Settings(fault_kill_after_checkpoint=3, fault_hold_call="after_intent:tools__slow"))
    assert loaded.checkpoint is not None and loaded.checkpoint.kill_after == 3
    assert loaded.hold is not None and loaded.after_outcome is None
    assert faults.HOOKS_MODULE == "tests.support.fault_hooks" and faults.HOOKS_MODULE in sys.modules
