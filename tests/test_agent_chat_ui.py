"""agent-chat-ui against Sophos, in Chromium (docs/agent-protocol.md, "agent-chat-ui, step by step").

Every flow of the UI, through the calls it makes (tests/support/chat_ui.py: the UI is not on a
package registry, so a replica built from tests/agent_chat_ui/ makes them with the SDK version the
UI pins), against one worker and API shared by the module, the fake tools server's ``add`` asking
for approval. ``SOPHOS_SCREENSHOTS=docs/screenshots`` writes the manual's screenshots.

One xdist worker runs the module (``ONE_WORKER_MODULES``, tests/conftest.py); its name puts it
first in collection order, so that worker starts it first and the suite does not wait on it last.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlencode

import httpx
import pytest
from playwright.sync_api import Page, expect

from tests.fakes.ollama import FakeOllama, Hang, Text, ToolCalls
from tests.support.browser import Offline, screenshot
from tests.support.chat_ui import build, static_site
from tests.support.client import get_json, tool_calls, wait_for
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
    expect(ui.locator(".ai .answer")).to_have_text("Paris is the ")  # tokens show as they come
    screenshot(ui, tmp_path, "agent-chat-ui-streaming")
    hang.release()
    expect(ui.locator(".ai .answer")).to_have_text("Paris is the capital of France.")
    idle(ui)
    send(ui, "How many people live there?")
    expect(ui.locator(".ai .answer")).to_have_text(
        ["Paris is the capital of France.", "About 2.1 million people."]
    )
    idle(ui)
    expect(ui.locator(".human")).to_have_count(2)
    # The thread history: found by metadata.graph_id, titled by its first message.
    expect(ui.locator("aside .thread").first).to_have_text("What is the capital of France?")
    screenshot(ui, tmp_path, "agent-chat-ui-history")


def asked_to_add(page: Page, model: FakeOllama, a: int, b: int, *then: Text) -> None:
    """A new thread whose model asks for ``add(a, b)``: the approval shows."""
    page.get_by_role("button", name="+ New thread").click()
    model.script(ToolCalls([("tools__add", {"a": a, "b": b})]), *then)
    send(page, f"Add {a} and {b}")
    expect(page.get_by_label("Approval")).to_contain_text("Tool execution requires approval")
    idle(page)


def test_an_approval_is_approved_in_the_ui_and_the_tool_runs(
    ui: Page, model: FakeOllama, tmp_path: Path
) -> None:
    asked_to_add(ui, model, 2, 3, Text("The sum is 5."))
    screenshot(ui, tmp_path, "agent-chat-ui-approval")
    ui.get_by_role("button", name="Approve").click()
    expect(ui.get_by_label("Tool result")).to_have_text("tools__add: 5")
    expect(ui.locator(".ai .answer").last).to_have_text("The sum is 5.")
    expect(ui.get_by_label("Approval")).to_have_count(0)
    idle(ui)
    screenshot(ui, tmp_path, "agent-chat-ui-approved")


def test_an_approval_is_edited_in_the_ui_and_the_tool_runs_with_the_new_arguments(
    ui: Page, model: FakeOllama
) -> None:
    asked_to_add(ui, model, 2, 2, Text("The sum is 10."))
    ui.get_by_label("Arguments").fill('{"a": 5, "b": 5}')
    ui.get_by_role("button", name="Edit").click()
    expect(ui.get_by_label("Tool result")).to_have_text("tools__add: 10")
    expect(ui.locator(".ai .answer").last).to_have_text("The sum is 10.")


def test_an_approval_is_rejected_in_the_ui_and_the_tool_never_runs(
    ui: Page, model: FakeOllama, stack: Stack
) -> None:
    asked_to_add(ui, model, 7, 7, Text("Fine, I will not add them."))
    ui.get_by_label("Response").fill("Not today")
    ui.get_by_role("button", name="Reject").click()
    expect(ui.locator(".ai .answer").last).to_have_text("Fine, I will not add them.")
    expect(ui.get_by_label("Tool result")).to_contain_text("Not today")
    assert [c for c in tool_calls(stack.env.tools_log, "add") if c["args"] == {"a": 7, "b": 7}] == []


def test_mark_as_resolved_is_refused_and_the_ui_says_why(ui: Page, model: FakeOllama, tmp_path: Path) -> None:
    asked_to_add(ui, model, 1, 2)
    ui.get_by_role("button", name="Mark as resolved").click()
    expect(ui.get_by_role("alert")).to_contain_text("command.goto is not served by Sophos")
    screenshot(ui, tmp_path, "agent-chat-ui-resolve-refused")
    # The approval still waits, and can still be answered.
    model.script(Text("The sum is 3."))
    ui.reload()
    ui.get_by_role("button", name="Approve").click()
    expect(ui.locator(".ai .answer").last).to_have_text("The sum is 3.")


def test_a_message_typed_while_an_approval_waits_rejects_the_call_then_is_answered(
    ui: Page, model: FakeOllama, stack: Stack, tmp_path: Path
) -> None:
    asked_to_add(ui, model, 4, 4, Text("All right, I did not add them."), Text("Why did the chicken cross?"))
    thread_id = thread_of(ui)
    # Tool messages must answer every pending call, and only on a thread that waits for them.
    stray = {"assistant_id": "agent", "input": {"messages": [
        {"type": "tool", "tool_call_id": "not-a-pending-call", "content": "done"},
        {"type": "human", "content": "hi"},
    ]}}
    refused = httpx.post(f"{stack.api}/threads/{thread_id}/runs", json=stray, timeout=10)
    assert refused.status_code == 422 and "answer every pending call" in refused.json()["error"]["message"]
    send(ui, "Never mind, tell me a joke")
    expect(ui.locator(".ai .answer")).to_have_text(
        ["All right, I did not add them.", "Why did the chicken cross?"]
    )
    expect(ui.get_by_label("Approval")).to_have_count(0)
    idle(ui)
    screenshot(ui, tmp_path, "agent-chat-ui-message-over-approval")
    assert [c for c in tool_calls(stack.env.tools_log, "add") if c["args"] == {"a": 4, "b": 4}] == []
    # What the model was told: the call rejected with the UI's text, then the new message.
    told = model.requests[-1]["messages"]
    assert "rejected" in told[-3]["content"] and told[-1]["content"] == "Never mind, tell me a joke"
    refused = httpx.post(f"{stack.api}/threads/{thread_id}/runs", json=stray, timeout=10)
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "NO_APPROVAL_PENDING"


def test_a_reload_mid_answer_shows_the_thread_and_the_answer_once_it_ended(
    ui: Page, model: FakeOllama, stack: Stack
) -> None:
    ui.get_by_role("button", name="+ New thread").click()
    hang = Hang(text="Once upon ", then=Text("a time."))
    model.script(hang)
    send(ui, "Tell me a story")
    expect(ui.locator(".ai .answer")).to_have_text("Once upon ")
    thread_id = thread_of(ui)
    ui.reload()
    # agent-chat-ui does not rejoin a run after a reload (no reconnectOnMount): it shows the
    # thread as its history has it, the message, while the run goes on.
    expect(ui.locator(".human")).to_have_text("Tell me a story")
    hang.release()
    wait_for(lambda: status_of(stack, thread_id) == "idle", message="the run ended")
    ui.reload()
    expect(ui.locator(".ai .answer")).to_have_text("Once upon a time.")
    expect(ui.locator(".human")).to_have_count(1)


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
    ui.get_by_role("button", name="+ New thread").click()
    model.script(Hang(text="Half an "))
    send(ui, "Write a long answer")
    expect(ui.locator(".ai .answer")).to_have_text("Half an ")
    thread_id = thread_of(ui)
    kill_the_worker(stack, model, thread_id)
    ui.reload()
    # The partial answer was never checkpointed: gone, and the UI says why and what to do.
    expect(ui.get_by_role("alert")).to_contain_text("was not kept. Send a new message to go on")
    expect(ui.locator(".human")).to_have_text("Write a long answer")
    expect(ui.locator(".ai")).to_have_count(0)
    expect(ui.get_by_label("Interrupt")).to_have_count(0)  # not shown as a bare breakpoint
    expect(ui.locator("aside .thread").first).to_have_text("Write a long answer")
    screenshot(ui, tmp_path, "agent-chat-ui-crashed")

    # A new message goes on; this time the worker dies while a tool call is out.
    model.script(ToolCalls([("tools__slow", {"seconds": 30})]))
    send(ui, "Please try again")
    # (Sophos sends values at the run's end: the page shows the call once the run is over.)
    pumping(ui, lambda: tool_calls(stack.env.tools_log, "slow"), "the slow call sent")
    kill_the_worker(stack, model, thread_id)
    ui.reload()
    expect(ui.get_by_role("alert")).to_contain_text("Send a new message to go on")
    expect(ui.get_by_label("Tool call")).to_contain_text("tools__slow")
    # The page adds a tool message for the call without a result; Sophos leaves it out and runs
    # the message from the last step kept, the call not sent again.
    model.script(Text("Here is a shorter one."))
    send(ui, "Forget the tool")
    expect(ui.locator(".ai .answer")).to_have_text("Here is a shorter one.")
    expect(ui.get_by_role("alert")).to_have_count(0)
    told = model.requests[-1]["messages"][1:]
    assert [m["content"] for m in told if m["role"] == "user"] == [
        "Write a long answer", "Please try again", "Forget the tool"
    ]
    assert "tool" not in [m["role"] for m in told] and len(tool_calls(stack.env.tools_log, "slow")) == 1
