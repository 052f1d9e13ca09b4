"""The web modules' browser: Debian's Chromium driven by Playwright, and what a test does in the page.

One browser for a module (``browser``); each test gets a fresh context (``offline``: its own
sessionStorage) in which every request to a host other than loopback is aborted and recorded,
and fails the test, as does an uncaught error in the page: the page and ``/schema`` must work on
a machine with no internet. The browser is the system's (``/usr/bin/chromium``, or
``SOPHOS_CHROMIUM``); Playwright's own download is never used. Without it the tests fail, naming
the install line, rather than skip. ``service`` starts the test's worker and API.

tests/conftest.py imports the fixtures, so that pytest finds them for every module.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.support.client import wait_for
from tests.support.env import SophosEnv

CHROMIUM = os.environ.get("SOPHOS_CHROMIUM", "/usr/bin/chromium")
INSTALL_LINE = "apt-get update && apt-get install -y chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run",
]
#: Playwright's waits, in milliseconds: generous, the machine is shared.
WAIT_MS = 20_000
LOOPBACK = {"127.0.0.1", "localhost", "[::1]", "::1"}

try:
    from playwright.sync_api import Browser, BrowserContext, Page, Playwright, expect, sync_playwright
except ImportError:  # pragma: no cover - the test extra installs it
    sync_playwright = None  # type: ignore[assignment]
else:
    # ``expect`` keeps a wait of its own (5 s), which ``page.set_default_timeout`` does not change.
    expect.set_options(timeout=WAIT_MS)


# --- the browser -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    if sync_playwright is None:
        pytest.fail("playwright is not installed: .venv/bin/pip install -c requirements.lock -e '.[test]'")
    with sync_playwright() as p:
        yield p


def launch(playwright: Playwright) -> Browser:
    """The system's Chromium, headless; the test fails, naming the install line, without it."""
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)) and not shutil.which(CHROMIUM):
        pytest.fail(f"the web tests need Chromium at {CHROMIUM}: install it with `{INSTALL_LINE}`")
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    browser = launch(playwright)
    yield browser
    browser.close()


class Offline:
    """A browser context that aborts (and records) every request leaving loopback."""

    def __init__(self, context: BrowserContext) -> None:
        self.context = context
        self.blocked: list[str] = []
        self.errors: list[str] = []
        context.route("**/*", self._route)

    def _route(self, route: Any) -> None:
        host = urlsplit(route.request.url).hostname or ""
        if host in LOOPBACK:
            route.continue_()
        else:
            self.blocked.append(route.request.url)
            route.abort("internetdisconnected")

    def page(self) -> Page:
        page = self.context.new_page()
        page.on("pageerror", lambda error: self.errors.append(str(error)))
        page.set_default_timeout(WAIT_MS)
        return page

    def open(self, url: str) -> Page:
        """A new page showing ``url``."""
        page = self.page()
        page.goto(url)
        return page


@pytest.fixture
def offline(browser: Browser, tmp_path: Path) -> Iterator[Offline]:
    context = browser.new_context(viewport={"width": 1100, "height": 760})
    offline = Offline(context)
    yield offline
    context.close()
    assert offline.blocked == [], f"the page asked for hosts beyond loopback: {offline.blocked}"
    assert offline.errors == [], f"uncaught errors in the page: {offline.errors}"


@pytest.fixture
def service(sophos_env: SophosEnv, start_worker, start_api) -> Callable[..., str]:
    """``service(**env changes) -> API url``: a worker and an API for this test."""

    def start(**changes: Any) -> str:
        env = sophos_env.with_(**changes)
        start_worker(env)
        return str(start_api(env).url)

    return start


def screenshot(page: Page, tmp_path: Path, name: str) -> None:
    page.screenshot(path=str(tmp_path / f"{name}.png"))
    if folder := os.environ.get("SOPHOS_SCREENSHOTS"):
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / f"{name}.png"))


def send(page: Page, text: str) -> None:
    # The page's module marks <html data-ready> once its listeners are attached (web/js/main.js):
    # an Enter before that is a newline in the box, and nothing is sent.
    page.wait_for_selector("html[data-ready]", state="attached")
    page.get_by_label("Message").fill(text)
    page.get_by_label("Message").press("Enter")


def conversation_of(page: Page) -> str:
    wait_for(lambda: re.search(r"#/c/([0-9a-f-]{36})$", page.url), message="a conversation in the URL")
    match = re.search(r"#/c/([0-9a-f-]{36})$", page.url)
    assert match
    return match.group(1)


def answers(page: Page) -> Any:
    return page.locator(".message.assistant .bubble")


def idle(page: Page) -> None:
    """Wait until no run streams into the view (the terminal event was handled)."""
    expect(page.locator(".message.streaming")).to_have_count(0)
    expect(page.locator("#stop")).to_be_hidden()
    expect(page.locator("#send")).to_be_enabled()
