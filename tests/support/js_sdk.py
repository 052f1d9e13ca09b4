"""The JavaScript LangGraph SDK (``@langchain/langgraph-sdk``), installed for the tests that drive
Sophos with it through node.

Installed once per version into a cache outside the checkout (``SOPHOS_TEST_CACHE``, else
``~/.cache/sophos-tests``) by npm, from npm's configured registry; a test that needs it is
skipped, saying why, only when node or npm is missing or the install fails (npm unreachable).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.support.cache import INSTALL_TIMEOUT, cache_root

#: the version the tests were written against (docs/agent-protocol.md); pinned so a run is repeatable
JS_SDK_VERSION = "1.15.0"
PACKAGE = "@langchain/langgraph-sdk"
#: the tests' scripts for node
JS_DIR = Path(__file__).parent.parent / "js"
#: an unreachable registry must cost the suite seconds, not npm's minutes of retries



def cache_dir() -> Path:
    return cache_root() / f"langgraph-sdk-js-{JS_SDK_VERSION}"


def js_sdk() -> Path:
    """A directory whose ``node_modules`` holds the SDK (installed now if it is not yet)."""
    for program in ("node", "npm"):
        if shutil.which(program) is None:
            pytest.skip(f"{program} is not on PATH: the JavaScript SDK test needs node and npm")
    target = cache_dir()
    if (target / "node_modules" / PACKAGE / "package.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        done = subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--no-save", "--fetch-retries=1",
             "--fetch-timeout=20000", "--prefix", str(staging), f"{PACKAGE}@{JS_SDK_VERSION}"],
            capture_output=True, text=True, timeout=INSTALL_TIMEOUT, check=False,
        )
    except subprocess.TimeoutExpired:
        shutil.rmtree(staging, ignore_errors=True)
        pytest.skip(f"npm could not install {PACKAGE}@{JS_SDK_VERSION} within {INSTALL_TIMEOUT:.0f} s")
    if done.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        said = " ".join(done.stderr.split())[:300]  # npm's first lines name the cause (ECONNREFUSED...)
        pytest.skip(f"npm could not install {PACKAGE}@{JS_SDK_VERSION}: {said}")
    try:
        staging.rename(target)  # whole or not at all: a cut install is never taken for one
    except OSError:  # another process installed it meanwhile
        shutil.rmtree(staging, ignore_errors=True)
    return target


def run_script(script: Path, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """``node script args...``, with the SDK importable: the script is run from a copy beside the
    installed ``node_modules`` (ES modules resolve packages from the importing file's place)."""
    sdk = js_sdk()
    copy = sdk / script.name
    shutil.copyfile(script, copy)
    return subprocess.run(
        ["node", str(copy), *args], capture_output=True, text=True, timeout=timeout, check=False, cwd=sdk
    )


async def run_js(script: str, *args: str) -> dict[str, Any]:
    """tests/js/``script`` run with ``args`` (:func:`run_script`, in a thread), which must exit 0;
    the JSON object it printed on stdout."""
    done = await asyncio.to_thread(run_script, JS_DIR / script, *args)
    assert done.returncode == 0, done.stderr
    out: dict[str, Any] = json.loads(done.stdout)
    return out
