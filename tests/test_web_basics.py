"""What people expect of a chat page, in Debian's Chromium against the real API and worker.

Copy buttons, highlighted code, the dark theme, titles without Markdown, renamed and searched,
Esc, Delete while an answer runs, a conversation that does not exist, titles in the runs view,
the empty page. The browser, the offline context and the service come from tests/support/browser.py
(same rules: every request beyond loopback is aborted and fails the test, as does an uncaught
error in the page).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.fakes.ollama import FakeOllama, Hang, Text
from tests.support.browser import Offline, Page, answers, conversation_of, expect, idle, screenshot, send
from tests.support.client import get_json, post_chat, wait_for
from tests.support.env import SophosEnv

CODE = "def add(a, b):\n    return a + b\n"
ANSWER = f"Here it is:\n\n```python\n{CODE}```\n\nThat is **all**."


def clipboard(page: Page) -> str:
    text: str = page.evaluate("navigator.clipboard.readText()")
    return text


def background(page: Page, selector: str) -> str:
    color: str = page.locator(selector).evaluate("node => getComputedStyle(node).backgroundColor")
    return color


def test_a_message_and_a_code_block_are_copied_and_the_code_is_highlighted(
    service: Callable[..., str], offline: Offline, model: FakeOllama, tmp_path: Path
) -> None:
    url = service()
    offline.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=url)
    model.script(Text(ANSWER))
    page = offline.open(url)
    send(page, "add two numbers\nin Python")
    answer = answers(page).last
    expect(answer.locator("strong")).to_have_text("all")
    idle(page)

    code = answer.locator(".code-block pre code")
    expect(code).to_have_attribute("data-language", "python")
    expect(code.locator(".hljs-keyword").first).to_have_text("def")
    expect(code.locator(".hljs-title")).to_have_text("add")
    expect(answer.locator(".code-language")).to_have_text("python")
    keyword = code.locator(".hljs-keyword").first.evaluate("node => getComputedStyle(node).color")
    assert keyword != code.evaluate("node => getComputedStyle(node).color")  # coloured, not just tagged
    expect(page.locator("#conversation-status")).to_have_text("completed")
    screenshot(page, tmp_path, "code")

    copy_code = answer.locator(".code-block button.copy")
    copy_code.click()
    expect(copy_code).to_have_text("Copied")
    assert clipboard(page) == CODE
    expect(copy_code).to_have_text("Copy")  # the feedback goes away by itself

    copy_answer = page.locator(".message.assistant .message-actions button.copy").last
    copy_answer.click()
    expect(copy_answer).to_have_text("Copied")
    assert clipboard(page) == ANSWER  # the Markdown, as the model wrote it

    copy_question = page.locator(".message.user .message-actions button.copy")
    copy_question.click()
    expect(copy_question).to_have_text("Copied")
    assert clipboard(page) == "add two numbers\nin Python"

    # Read back from the checkpoint, the same.
    page.reload()
    expect(answers(page).last.locator(".code-block code .hljs-keyword").first).to_have_text("def")
    page.locator(".code-block button.copy").click()
    expect(page.locator(".code-block button.copy")).to_have_text("Copied")
    assert clipboard(page) == CODE


def test_the_dark_theme_follows_the_system(
    service: Callable[..., str], offline: Offline, model: FakeOllama, tmp_path: Path
) -> None:
    url = service()
    model.script(Text(ANSWER))
    page = offline.open(url)
    send(page, "add two numbers")
    expect(answers(page).last.locator(".hljs-keyword").first).to_have_text("def")
    idle(page)
    assert background(page, "html") == "rgb(247, 247, 245)"
    assert background(page, ".composer") == "rgb(255, 255, 255)"
    light_keyword = page.locator(".hljs-keyword").first.evaluate("node => getComputedStyle(node).color")
    expect(page.locator("#conversation-status")).to_have_text("completed")

    page.emulate_media(color_scheme="dark")
    assert background(page, "html") == "rgb(23, 24, 27)"
    assert background(page, ".composer") == "rgb(32, 33, 36)"
    assert background(page, ".message.assistant .bubble") == "rgb(32, 33, 36)"
    assert background(page, ".code-block pre") == "rgb(42, 43, 48)"
    assert page.locator("html").evaluate("node => getComputedStyle(node).color") == "rgb(230, 230, 227)"
    dark_keyword = page.locator(".hljs-keyword").first.evaluate("node => getComputedStyle(node).color")
    assert dark_keyword != light_keyword
    screenshot(page, tmp_path, "chat-dark")


def test_titles_show_without_markdown_can_be_renamed_and_searched(
    service: Callable[..., str], offline: Offline, model: FakeOllama
) -> None:
    url = service()
    model.script(Text("Where to?"))
    page = offline.open(url)
    send(page, "**Plan** my `trip`\nto [Rome](https://example.org)")
    expect(page.locator("#conversation-title")).to_have_text("Plan my trip")
    idle(page)
    conversation = conversation_of(page)
    stored = get_json(url, f"/api/conversations/{conversation}")["conversation"]["title"]
    assert stored == "**Plan** my `trip`"  # the API keeps the words; the page drops the markers
    item = page.locator(f'#conversations li[data-id="{conversation}"]')
    expect(item.locator(".title")).to_have_text("Plan my trip")
    page.reload()
    expect(page.locator("#conversation-title")).to_have_text("Plan my trip")

    # The runs view names the run's conversation by that title (GET /api/runs gives its id).
    page.get_by_role("link", name="Runs").click()
    link = page.locator("#runs-finished tr[data-status=completed] a.conversation")
    expect(link).to_have_text("Plan my trip")
    expect(link).to_have_attribute("href", f"#/c/{conversation}")
    expect(link).to_have_attribute("title", conversation)

    # Renamed from the header: Esc cancels, a blank title is refused and changes nothing, Enter saves.
    link.click()
    title, field = page.locator("#conversation-title"), page.get_by_label("Title")
    page.get_by_role("button", name="Rename").click()
    expect(field).to_be_focused()
    expect(field).to_have_value("**Plan** my `trip`")
    field.fill("Something else")
    field.press("Escape")
    expect(field).to_be_hidden()
    expect(title).to_have_text("Plan my trip")
    page.get_by_role("button", name="Rename").click()
    field.fill("   ")
    field.press("Enter")
    expect(page.locator('.banner[data-code="INVALID_TITLE"]')).to_contain_text("empty")
    expect(field).to_be_visible()
    assert get_json(url, f"/api/conversations/{conversation}")["conversation"]["title"] == stored
    field.fill("Rome in May")
    field.press("Enter")
    expect(title).to_have_text("Rome in May")
    expect(field).to_be_hidden()
    expect(item.locator(".title")).to_have_text("Rome in May")
    assert get_json(url, f"/api/conversations/{conversation}")["conversation"]["title"] == "Rome in May"
    page.reload()
    expect(title).to_have_text("Rome in May")

    # The search box filters the sidebar by title as you type, case aside.
    model.script(Text("Noted."))
    page.get_by_role("button", name="New chat").click()
    send(page, "Packing list")
    idle(page)
    other = conversation_of(page)
    listed = page.locator("#conversations li")
    expect(listed).to_have_count(2)
    search = page.get_by_label("Search conversations")
    search.press_sequentially("ROME")
    expect(listed).to_have_count(1)
    expect(listed.first).to_have_attribute("data-id", conversation)
    search.fill("no such title")
    expect(listed).to_have_count(0)
    expect(page.locator("#no-match")).to_be_visible()
    search.fill("")
    expect(listed).to_have_count(2)
    expect(page.locator("#no-match")).to_be_hidden()
    expect(listed.first).to_have_attribute("data-id", other)


def test_escape_stops_the_answer_and_delete_waits_for_the_run(
    service: Callable[..., str], offline: Offline, model: FakeOllama
) -> None:
    url = service()
    hang = Hang(text="Thinking about it ")
    model.script(hang)
    page = offline.open(url)
    expect(page.locator("#delete")).to_be_hidden()
    send(page, "take your time")
    hang.wait_started(20)
    expect(answers(page).last).to_contain_text("Thinking about it")
    delete = page.get_by_role("button", name="Delete")
    expect(delete).to_be_disabled()  # the API would refuse it (409) while the run is active
    conversation = conversation_of(page)
    run = get_json(url, f"/api/runs?conversation={conversation}")["runs"][0]
    assert run["status"] == "running"

    page.keyboard.press("Escape")
    expect(page.locator(".note")).to_have_text("Stopped.")
    idle(page)
    hang.release()
    assert get_json(url, f"/api/runs/{run['id']}")["status"] == "cancelled"
    expect(page.locator("#conversation-status")).to_have_text("stopped")
    expect(delete).to_be_enabled()

    # A run queued from elsewhere disables it too, once the page sees it.
    model.script(Hang(text="again "))
    assert post_chat(url, "from the command line", conversation).status_code == 202
    page.reload()
    expect(page.locator(".message.streaming")).to_have_count(1)
    expect(delete).to_be_disabled()
    page.keyboard.press("Escape")
    expect(page.locator(".note").last).to_have_text("Stopped.")
    expect(delete).to_be_enabled()


def test_an_unknown_conversation_is_a_not_found_view_and_the_empty_page_names_who_answers(
    service: Callable[..., str], offline: Offline, sophos_env: SophosEnv, tmp_path: Path, model: FakeOllama
) -> None:
    url = service()
    missing = str(uuid.uuid4())
    page = offline.open(f"{url}/#/c/{missing}")
    view = page.locator("#not-found")
    expect(view.get_by_role("heading")).to_have_text("Conversation not found")
    expect(view.locator("#not-found-id")).to_have_text(missing)
    for part in ("#conversation-bar", "#composer", "#messages", "#delete", "#stop", "#resume"):
        expect(page.locator(part)).to_be_hidden()
    expect(page.locator(".banner")).to_have_count(0)
    response = get_json(url, f"/api/conversations/{missing}", expect=404)
    assert response["error"]["code"] == "NOT_FOUND"

    view.get_by_role("link", name="Start a new chat").click()
    wait_for(lambda: page.url.endswith("#/"), message="back to a new chat")
    expect(view).to_be_hidden()
    expect(page.get_by_label("Message")).to_be_visible()
    expect(page.locator("#empty")).to_be_visible()

    # The empty page names the model and lists the agent's tools, as the worker's heartbeat says.
    agent = get_json(url, "/api/agent")
    assert agent["model"] == sophos_env["OLLAMA_MODEL"] == "test-model" and agent["workerAlive"] is True
    described = {tool["name"]: tool["description"] for tool in agent["tools"]}
    assert described["tools__add"] == "Add two integers." and "tools__echo" in described
    panel = page.get_by_role("region", name="Who answers")
    expect(panel.locator("#agent-model")).to_have_text(agent["model"])
    expect(panel.locator("#agent-tools li")).to_have_count(len(described))
    add = panel.locator("#agent-tools li", has_text="tools__add")
    expect(add).to_have_text("tools__add Add two integers.")
    screenshot(page, tmp_path, "empty")

    # With only the default there is no choice to make; with another assistant, a new
    # conversation may begin with it (docs/agent-protocol.md, "Assistants").
    picker = page.get_by_label("Assistant")
    expect(picker).to_be_hidden()
    made = httpx.post(f"{url}/assistants", json={"graph_id": "agent", "name": "Poet",
                                                "context": {"system_prompt": "You are Poet."}})
    assert made.status_code == 200, made.text
    page.locator("#new-chat").click()
    expect(picker).to_be_visible()
    picker.select_option(label="Poet")
    model.script(Text("Roses."))
    send(page, "a poem")
    expect(answers(page).last).to_have_text("Roses.")
    assert model.requests[-1]["messages"][0] == {"role": "system", "content": "You are Poet."}
