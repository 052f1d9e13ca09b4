"""agent-chat-ui served for the browser tests (tests/test_agent_chat_ui.py): the build
(tests/support/chat_ui_build.py), skipped or failed as pytest says it, and ``next start`` on a
loopback port (:func:`serve`). A test that needs the UI is skipped, saying why, when node or npm
is missing or npm cannot fetch; a build that fails fails it.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.support import chat_ui_build
from tests.support.chat_ui_build import ENV
from tests.support.client import wait_for
from tests.support.ports import free_port


def build() -> Path:
    """The built app's folder (:func:`tests.support.chat_ui_build.build`), or the test skipped or failed."""
    try:
        return chat_ui_build.build()
    except chat_ui_build.Unavailable as exc:
        pytest.skip(str(exc))
    except chat_ui_build.BuildFailed as exc:
        pytest.fail(str(exc))


class Site:
    """``next start`` for a built app on a loopback port, started, not yet waited for: the
    module's API starts meanwhile (it needs the origin, for CORS)."""

    def __init__(self, app: Path) -> None:
        port = free_port()
        self.origin = f"http://127.0.0.1:{port}"
        self.process = subprocess.Popen(
            [str(app / "node_modules" / ".bin" / "next"), "start", "-H", "127.0.0.1", "-p", str(port)],
            cwd=app, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        self.up = False

    def _answers(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"next start ended with {self.process.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(self.origin, timeout=2).status_code == 200
        return False

    def wait(self) -> str:
        """The origin, once the page is served."""
        if not self.up:
            wait_for(self._answers, message="agent-chat-ui's next start answering", timeout=30)
            self.up = True
        return self.origin


@contextmanager
def serve(app: Path) -> Iterator[Site]:
    """The built ``app`` served by ``next start`` on loopback (:class:`Site`), stopped after."""
    site = Site(app)
    try:
        yield site
    finally:
        site.process.terminate()
        site.process.wait(timeout=10)
