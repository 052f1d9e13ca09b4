"""agent-chat-ui against Sophos, in Chromium (docs/agent-protocol.md, "agent-chat-ui, step by step").

The UI itself, LangChain's published release (tests/support/chat_ui.py builds it from
``create-agent-chat-app`` 0.1.6 and serves it with ``next start``), pointed at one worker and API
shared by the module, the fake tools server's ``add`` asking for approval. Every flow is asserted
on what the page shows. ``SOPHOS_SCREENSHOTS=docs/screenshots`` writes the manual's screenshots.

One xdist worker runs the module (``ONE_WORKER_MODULES``, tests/conftest.py); its name puts it
first in collection order, so that worker starts it first and the suite does not wait on it last.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlencode

import pytest
from playwright.sync_api import Locator, Page, expect

from tests.fakes.ollama import FakeOllama, Hang, Text, ToolCalls
from tests.support.browser import Offline, screenshot
from tests.support.chat_ui import Site, build, serve
from tests.support.client import get_json, tool_calls, wait_for
from tests.support.redis_server import RedisServer
from tests.support.stacks import Stack, module_stack

#: the tests on the module's shared stack run in one xdist worker, which starts it once
pytestmark = pytest.mark.xdist_group("test_agent_chat_ui")


@pytest.fixture(scope="module")
def next_start() -> Iterator[Site]:
    with serve(build()) as site:
        yield site


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, fake_ollama: FakeOllama, next_start: Site
) -> Iterator[Stack]:
    """One API and worker for the module, on a Redis of its own, the UI's origin allowed."""
    root = tmp_path_factory.mktemp("agent-chat-ui")
    redis_server = RedisServer(root / "redis", appendonly=False)
    redis_server.start()
    try:
        with module_stack(
            root, redis_server.url, fake_ollama, approval=["add"], CORS_ORIGINS=next_start.origin
        ) as stack:
            yield stack
    finally:
        redis_server.stop()


@pytest.fixture(scope="module")
def site(next_start: Site, stack: Stack) -> str:
    """The UI's origin, once it is served (it starts while the stack does)."""
    return next_start.wait()


def url(site: str, stack: Stack, **more: str) -> str:
    """The UI pointed at the module's API, as its setup form would (``apiUrl``, ``assistantId``),
    its thread history open."""
    query = {"apiUrl": stack.api, "assistantId": "agent", "chatHistoryOpen": "true", **more}
    return f"{site}/?{urlencode(query)}"


@pytest.fixture
def ui(stack: Stack, site: str, offline: Offline, model: FakeOllama) -> Page:
    return offline.open(url(site, stack))


def send(page: Page, text: str) -> None:
    page.get_by_placeholder("Type your message...").fill(text)
    page.get_by_placeholder("Type your message...").press("Enter")


def idle(page: Page) -> None:
    expect(page.get_by_role("button", name="Send", exact=True)).to_be_visible()


def said(page: Page, text: str) -> Locator:
    """A message's text on the page (human or AI: the UI marks neither with a role or label), not
    the thread history's title (a button)."""
    return page.get_by_text(text, exact=True).locator("xpath=self::*[not(ancestor::button)]")


def toast(page: Page, text: str) -> Locator:
    """The UI's toast (sonner) saying ``text``, shown and done moving in (for its screenshot)."""
    shown = page.locator("[data-sonner-toast]").filter(has_text=text)
    expect(shown).to_be_visible()
    expect(shown).to_have_css("opacity", "1")
    return shown


def pumping(page: Page, condition: Callable[[], object], message: str, timeout: float = 20.0) -> None:
    """Wait for ``condition`` while the page's requests go on (every request of the page passes
    a route handler of this thread: tests/support/browser.py's ``Offline``; a plain wait would
    hold them)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {message}")
        page.wait_for_timeout(50)


def status_of(stack: Stack, thread_id: str) -> str:
    return str(get_json(stack.api, f"/threads/{thread_id}")["status"])


def thread_of(page: Page) -> str:
    wait_for(lambda: "threadId=" in page.url, message="a thread id in the URL")
    return page.url.split("threadId=", 1)[1].split("&", 1)[0]


def test_an_answer_streams_a_second_message_follows_and_the_history_shows_titles(
    ui: Page, model: FakeOllama, tmp_path: Path
) -> None:
    hang = Hang(text="Paris is the ", then=Text("capital of France."))
    model.script(hang, Text("About 2.1 million people."))
    send(ui, "What is the capital of France?")
    expect(said(ui, "Paris is the")).to_be_visible()  # tokens show as they come
    screenshot(ui, tmp_path, "agent-chat-ui-streaming")
    hang.release()
    expect(said(ui, "Paris is the capital of France.")).to_be_visible()
    idle(ui)
    send(ui, "How many people live there?")
    expect(said(ui, "About 2.1 million people.")).to_be_visible()
    idle(ui)
    expect(said(ui, "Paris is the capital of France.")).to_be_visible()
    # The thread history: found by metadata.graph_id, titled by its first message (the UI reads
    # it 4 s after the thread is made; a reload reads it at once).
    ui.reload()
    history = ui.get_by_role("button", name="What is the capital of France?")
    expect(history).to_be_visible()
    expect(said(ui, "How many people live there?")).to_be_visible()
    screenshot(ui, tmp_path, "agent-chat-ui-history")


def asked_to_add(page: Page, site: str, stack: Stack, model: FakeOllama, a: int, b: int, *then: Text) -> None:
    """A new thread whose model asks for ``add(a, b)``: the approval shows."""
    page.goto(url(site, stack))
    model.script(ToolCalls([("tools__add", {"a": a, "b": b})]), *then)
    send(page, f"Add {a} and {b}")
    expect(page.get_by_role("button", name="Mark as Resolved")).to_be_visible()
    expect(page.get_by_text("Edit/Accept", exact=True)).to_be_visible()
    idle(page)


def test_an_approval_is_accepted_in_the_ui_and_the_tool_runs(
    ui: Page, site: str, stack: Stack, model: FakeOllama, tmp_path: Path
) -> None:
    asked_to_add(ui, site, stack, model, 2, 3, Text("The sum is 5."))
    screenshot(ui, tmp_path, "agent-chat-ui-approval")
    ui.get_by_role("button", name="Accept").click()
    expect(said(ui, "The sum is 5.")).to_be_visible()
    expect(ui.get_by_role("button", name="Mark as Resolved")).to_have_count(0)
    idle(ui)
    assert [c["args"] for c in tool_calls(stack.env.tools_log, "add")][-1] == {"a": 2, "b": 3}
    screenshot(ui, tmp_path, "agent-chat-ui-approved")


def test_an_approval_is_edited_in_the_ui_and_the_tool_runs_with_the_new_arguments(
    ui: Page, site: str, stack: Stack, model: FakeOllama
) -> None:
    asked_to_add(ui, site, stack, model, 2, 2, Text("The sum is 10."))
    for _ in ("a", "b"):  # the fields of the edit form, one per argument, each showing 2
        ui.locator("textarea").filter(has_text="2").first.fill("5")
    ui.get_by_role("button", name="Submit").click()
    expect(said(ui, "The sum is 10.")).to_be_visible()
    assert [c["args"] for c in tool_calls(stack.env.tools_log, "add")][-1] == {"a": 5, "b": 5}


def test_an_approval_is_answered_with_a_response_and_the_tool_never_runs(
    ui: Page, site: str, stack: Stack, model: FakeOllama
) -> None:
    asked_to_add(ui, site, stack, model, 7, 7, Text("Fine, I will not add them."))
    ui.get_by_placeholder("Your response here...").fill("Not today")
    ui.get_by_role("button", name="Send Response").click()
    expect(said(ui, "Fine, I will not add them.")).to_be_visible()
    expect(ui.get_by_text("it was not executed. Their message: Not today")).to_be_visible()
    assert [c for c in tool_calls(stack.env.tools_log, "add") if c["args"] == {"a": 7, "b": 7}] == []
    assert "Not today" in str(model.requests[-1]["messages"])  # the model was told


def test_mark_as_resolved_is_refused_and_the_ui_says_why(
    ui: Page, site: str, stack: Stack, model: FakeOllama, tmp_path: Path
) -> None:
    asked_to_add(ui, site, stack, model, 1, 2)
    ui.get_by_role("button", name="Mark as Resolved").click()
    toast(ui, "command.goto is not served by Sophos")
    screenshot(ui, tmp_path, "agent-chat-ui-resolve-refused")
    # The approval still waits, and can still be answered.
    model.script(Text("The sum is 3."))
    ui.reload()
    ui.get_by_role("button", name="Accept").click()
    expect(said(ui, "The sum is 3.")).to_be_visible()


def test_a_message_typed_while_an_approval_waits_rejects_the_call_then_is_answered(
    ui: Page, site: str, stack: Stack, model: FakeOllama, tmp_path: Path
) -> None:
    asked_to_add(ui, site, stack, model, 4, 4, Text("All right, I did not add them."),
                 Text("Why did the chicken cross?"))
    thread_id = thread_of(ui)
    send(ui, "Never mind, tell me a joke")
    expect(said(ui, "Why did the chicken cross?")).to_be_visible()
    expect(said(ui, "All right, I did not add them.")).to_be_visible()
    expect(ui.get_by_role("button", name="Mark as Resolved")).to_have_count(0)
    idle(ui)
    screenshot(ui, tmp_path, "agent-chat-ui-message-over-approval")
    assert [c for c in tool_calls(stack.env.tools_log, "add") if c["args"] == {"a": 4, "b": 4}] == []
    # What the model was told: the call rejected with the UI's text, then the new message.
    told = model.requests[-1]["messages"]
    assert "rejected" in told[-3]["content"] and told[-1]["content"] == "Never mind, tell me a joke"
    assert status_of(stack, thread_id) == "idle"


def test_a_reload_mid_answer_cancels_the_run_and_keeps_what_was_streamed(
    ui: Page, model: FakeOllama, stack: Stack
) -> None:
    hang = Hang(text="Once upon ", then=Text("a time."))
    model.script(hang)
    send(ui, "Tell me a story")
    expect(said(ui, "Once upon")).to_be_visible()
    thread_id = thread_of(ui)
    ui.reload()
    # This agent-chat-ui streams with on_disconnect "cancel" (the SDK's useStream default then):
    # leaving the page cancels the run, as the Agent Server does; what was streamed is kept.
    pumping(ui, lambda: status_of(stack, thread_id) == "idle", "the run cancelled")
    expect(said(ui, "Tell me a story")).to_be_visible()
    ui.reload()
    expect(said(ui, "Once upon")).to_be_visible()
    hang.release()


def kill_the_worker(stack: Stack, model: FakeOllama, thread_id: str) -> None:
    """SIGKILL the module's worker, start another, wait until it has ended the thread's cut run
    (recorded: the thread's head says so)."""
    stack.worker.signal(signal.SIGKILL)
    stack.worker.wait()
    model.reset()  # after the kill: a reply cut before it would fail the run instead
    stack.worker = stack.group.start_worker(stack.env)

    def noted() -> bool:
        tasks = get_json(stack.api, f"/threads/{thread_id}/state")["tasks"]
        said = tasks[-1]["error"] if tasks else None
        return status_of(stack, thread_id) != "busy" and "not kept" in (said or "")

    wait_for(noted, message="the cut run ended and recorded")


def test_a_crashed_run_says_so_after_a_reload_and_a_new_message_goes_on(
    ui: Page, model: FakeOllama, stack: Stack, tmp_path: Path
) -> None:
    """Last in the module: it kills the module's worker (SIGKILL), twice, and starts another."""
    model.script(Hang(text="Half an "))
    send(ui, "Write a long answer")
    expect(said(ui, "Half an")).to_be_visible()
    thread_id = thread_of(ui)
    kill_the_worker(stack, model, thread_id)
    ui.reload()
    # The partial answer was never checkpointed: gone, and the UI says why and what to do.
    toast(ui, "was not kept. Send a new message to go on")
    expect(said(ui, "Write a long answer").first).to_be_visible()
    expect(said(ui, "Half an")).to_have_count(0)
    screenshot(ui, tmp_path, "agent-chat-ui-crashed")

    # A new message goes on; this time the worker dies while a tool call is out.
    model.script(ToolCalls([("tools__slow", {"seconds": 30})]))
    send(ui, "Please try again")
    pumping(ui, lambda: tool_calls(stack.env.tools_log, "slow"), "the slow call sent")
    kill_the_worker(stack, model, thread_id)
    ui.reload()
    toast(ui, "Send a new message to go on")
    expect(ui.get_by_text("tools__slow").first).to_be_visible()
    # The page adds a tool message for the call without a result; Sophos leaves it out and runs
    # the message from the last step kept, the call not sent again.
    model.script(Text("Here is a shorter one."))
    send(ui, "Forget the tool")
    expect(said(ui, "Here is a shorter one.")).to_be_visible()
    told = model.requests[-1]["messages"][1:]
    assert [m["content"] for m in told if m["role"] == "user"] == [
        "Write a long answer", "Please try again", "Forget the tool"
    ]
    assert "tool" not in [m["role"] for m in told] and len(tool_calls(stack.env.tools_log, "slow")) == 1
