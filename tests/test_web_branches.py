"""Branches in the page, in Debian's Chromium against the real API and worker: Edit a message and
switch back with the `< 2/3 >` switcher, Regenerate an answer. The browser, the offline context
and the service come from tests/support/browser.py (same rules: every request beyond loopback is
aborted and fails the test, as does an uncaught error in the page). One service, one test: a
started stack is the expensive part.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.fakes.ollama import FakeOllama, Hang, Text, ToolCalls
from tests.support.browser import Offline, Page, answers, conversation_of, expect, idle, screenshot, send
from tests.support.client import get_json
from tests.support.env import SophosEnv, mcp_servers, not_safe_to_repeat


def users(page: Page) -> object:
    return page.locator(".message.user .bubble")


def test_edit_switch_back_and_regenerate(
    service: Callable[..., str], offline: Offline, model: FakeOllama, tmp_path: Path,
    sophos_env: SophosEnv,
) -> None:
    # The tools may act on the world (not safe to repeat): a fork that leaves a call of one says so.
    tools = mcp_servers(sophos_env.tools_log, sophos_env.root / "empty-bin")
    sophos_env.write_mcp_config(not_safe_to_repeat(tools))
    url = service()
    again = Hang(text="It is ", then=Text("Paris."))
    model.script(
        ToolCalls([("tools__echo", {"text": "noted"})]), Text("Paris."),
        Text("Marseille is the oldest."), again,
    )
    page = offline.open(url)
    send(page, "What is the capital of France?")
    expect(answers(page)).to_have_text(["Paris."])
    idle(page)
    conversation = conversation_of(page)

    # Edit: the message becomes a box; Esc leaves it as it was, Send forks the thread before it.
    page.locator(".message.user button.edit").click()
    box = page.get_by_label("Edited message")
    expect(box).to_have_value("What is the capital of France?")
    box.fill("never sent")
    box.press("Escape")
    expect(box).to_have_count(0)
    expect(users(page)).to_have_text(["What is the capital of France?"])
    page.locator(".message.user button.edit").click()
    box = page.get_by_label("Edited message")
    expect(box).to_have_value("What is the capital of France?")
    box.fill("Which is the oldest city of France?")
    box.press("Enter")
    effects = page.locator(".banner[data-code='EFFECTS_STAY']")
    expect(effects).to_contain_text('tools__echo {"text":"noted"}')
    expect(users(page)).to_have_text(["Which is the oldest city of France?"])
    expect(answers(page)).to_have_text(["Marseille is the oldest."])
    idle(page)
    switcher = page.locator(".message.user .branch-switcher")
    expect(switcher.locator(".branch-position")).to_have_text("2/2")
    expect(switcher.locator(".branch-next")).to_be_disabled()
    expect(switcher.locator(".branch-acted")).to_have_text("1 tool call on other branches acted")
    screenshot(page, tmp_path, "branch-edit")

    # Back to the first branch: its question and answer, as they were.
    switcher.locator(".branch-prev").click()
    expect(users(page)).to_have_text(["What is the capital of France?"])
    expect(answers(page)).to_have_text(["Paris."])
    expect(switcher.locator(".branch-position")).to_have_text("1/2")
    expect(switcher.locator(".branch-acted")).to_have_count(0)  # the call was made on this branch
    idle(page)
    detail = get_json(url, f"/api/conversations/{conversation}")
    assert [m["content"] for m in detail["messages"] if m["role"] != "tool"] == [
        "What is the capital of France?", "", "Paris.",
    ]

    # Regenerate: another answer to the same question, a third branch.
    page.locator(".message.assistant button.regenerate").click()
    again.wait_started()
    expect(page.locator(".message.streaming")).to_have_count(1)
    expect(page.locator(".message.user button.edit")).to_be_hidden()  # no fork while a run streams
    expect(page.locator(".message.assistant button.regenerate")).to_be_hidden()
    again.release()
    expect(answers(page)).to_have_text(["It is Paris."])
    idle(page)
    expect(users(page)).to_have_text(["What is the capital of France?"])
    expect(switcher.locator(".branch-position")).to_have_text("3/3")
    screenshot(page, tmp_path, "branch-regenerate")
    sent = model.requests[-1]["messages"]
    assert [m["content"] for m in sent[1:]] == ["What is the capital of France?"]  # not the old answer
