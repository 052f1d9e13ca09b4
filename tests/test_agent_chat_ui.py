"""agent-chat-ui against Sophos, in Chromium (docs/agent-protocol.md, "agent-chat-ui, step by step").

Every flow of the UI, through the calls it makes (tests/support/chat_ui.py: the UI is not on a
package registry, so a replica built from tests/agent_chat_ui/ makes them with the SDK version the
UI pins), against one worker and API shared by the module, the fake tools server's ``add`` asking
for approval. ``SOPHOS_SCREENSHOTS=docs/img/agent-chat-ui`` writes the manual's screenshots.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.fakes.ollama import FakeOllama, Hang, Text, ToolCalls
from tests.support.browser import Offline, screenshot
from tests.support.chat_ui import build, static_site
from tests.support.client import get_json, wait_for
from tests.support.redis_server import RedisServer
from tests.support.stacks import Stack, module_stack

#: the tests on the module's shared stack run in one xdist worker, which starts it once
pytestmark = pytest.mark.xdist_group("test_agent_chat_ui")


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    with static_site(build()) as origin:
        yield origin


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, fake_ollama: FakeOllama, site: str) -> Iterator[Stack]:
    """One API and worker for the module, on a Redis of its own, the UI's origin allowed."""
    root = tmp_path_factory.mktemp("agent-chat-ui")
    redis_server = RedisServer(root / "redis", appendonly=False)
    redis_server.start()
    try:
        with module_stack(root, redis_server.url, fake_ollama, approval=["add"], CORS_ORIGINS=site) as stack:
            yield stack
    finally:
        redis_server.stop()


@pytest.fixture
def ui(stack: Stack, site: str, offline: Offline, model: FakeOllama) -> Page:
    """The UI pointed at the module's API, as its setup form would (``apiUrl``, ``assistantId``)."""
    return offline.open(f"{site}/?{urlencode({'apiUrl': stack.api, 'assistantId': 'agent'})}")


def send(page: Page, text: str) -> None:
    page.get_by_label("Message").fill(text)
    page.get_by_label("Message").press("Enter")


def idle(page: Page) -> None:
    expect(page.get_by_role("button", name="Send")).to_be_visible()


def thread_of(page: Page) -> str:
    wait_for(lambda: "threadId=" in page.url, message="a thread id in the URL")
    return page.url.split("threadId=", 1)[1].split("&", 1)[0]


def test_an_answer_streams_a_second_message_follows_and_the_history_shows_titles(
    ui: Page, model: FakeOllama, tmp_path: Path
) -> None:
    hang = Hang(text="Paris is the ", then=Text("capital of France."))
    model.script(hang, Text("About 2.1 million people."))
    send(ui, "What is the capital of France?")
    expect(ui.locator(".ai .answer")).to_have_text("Paris is the ")  # tokens show as they come
    screenshot(ui, tmp_path, "agent-chat-ui-streaming")
    hang.release()
    expect(ui.locator(".ai .answer")).to_have_text("Paris is the capital of France.")
    idle(ui)
    send(ui, "How many people live there?")
    expect(ui.locator(".ai .answer")).to_have_text(["Paris is the capital of France.", "About 2.1 million people."])
    idle(ui)
    expect(ui.locator(".human")).to_have_count(2)
    # The thread history: found by metadata.graph_id, titled by its first message.
    expect(ui.locator("aside .thread").first).to_have_text("What is the capital of France?")
    screenshot(ui, tmp_path, "agent-chat-ui-history")
