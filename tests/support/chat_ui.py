"""agent-chat-ui's calls, built for the browser tests (tests/test_agent_chat_ui.py).

agent-chat-ui (github langchain-ai/agent-chat-ui) is not published to a package registry: the one
package that holds a copy, ``create-agent-chat-app`` 0.1.6, templates an agent-chat-ui of April
2025 whose approval view reads the superseded ``HumanInterrupt`` shape. The tests therefore drive a
replica (tests/agent_chat_ui/app.jsx) that makes the UI's calls through the SDK version its
lockfile pins (``@langchain/langgraph-sdk`` 1.8.10, the ``useStream`` hook), built with esbuild.

Installed by npm from its configured registry and built once per version of the replica's files
into a cache outside the checkout (``SOPHOS_TEST_CACHE``, else ``~/.cache/sophos-tests``), whole or
not at all; a test that needs it is skipped, saying why, only when node or npm is missing or the
install fails. :class:`StaticSite` serves the build on loopback.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.support.js_sdk import INSTALL_TIMEOUT, cache_root
from tests.support.ports import free_port

SOURCE = Path(__file__).resolve().parent.parent / "agent_chat_ui"
FILES = ("package.json", "app.jsx", "index.html")
BUILD_TIMEOUT = 120.0


def _key() -> str:
    digest = hashlib.sha256()
    for name in FILES:
        digest.update(name.encode() + b"\0" + (SOURCE / name).read_bytes())
    return digest.hexdigest()[:12]


def _run(args: list[str], cwd: Path, timeout: float, what: str, *, skip: bool) -> None:
    """Run ``args``; if it fails, skip the test (``skip``: npm could not reach its registry) or fail it."""
    outcome = pytest.skip if skip else pytest.fail
    try:
        done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        outcome(f"{what} did not finish within {timeout:.0f} s")
    if done.returncode != 0:
        said = " ".join((done.stderr or done.stdout).split())[:400]
        outcome(f"{what} failed: {said}")


def build() -> Path:
    """The folder holding the built page (``index.html``, ``app.js``), built now if it is not yet."""
    for program in ("node", "npm"):
        if shutil.which(program) is None:
            pytest.skip(f"{program} is not on PATH: the agent-chat-ui tests need node and npm")
    target = cache_root() / f"agent-chat-ui-{_key()}"
    if (target / "dist" / "app.js").exists():
        return target / "dist"
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        for name in FILES:
            shutil.copyfile(SOURCE / name, staging / name)
        _run(["npm", "install", "--no-audit", "--no-fund", "--fetch-retries=1", "--fetch-timeout=20000"],
             staging, INSTALL_TIMEOUT, "npm install of the agent-chat-ui replica's packages", skip=True)
        _run([str(staging / "node_modules" / ".bin" / "esbuild"), "app.jsx", "--bundle", "--minify",
              "--jsx=automatic", "--define:process.env.NODE_ENV=\"production\"", "--outfile=dist/app.js"],
             staging, BUILD_TIMEOUT, "esbuild of the agent-chat-ui replica", skip=False)
        shutil.copyfile(staging / "index.html", staging / "dist" / "index.html")
        shutil.rmtree(staging / "node_modules")  # 74 MB that the build no longer needs
        with contextlib.suppress(OSError):  # OSError: another process built it meanwhile
            staging.rename(target)  # whole or not at all
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target / "dist"


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def static_site(folder: Path) -> Iterator[str]:
    """``folder`` served on loopback: its origin (``http://127.0.0.1:PORT``)."""
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), functools.partial(_Quiet, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, name="chat-ui-site", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
