"""The web page at ``/``, in Debian's Chromium driven by Playwright, against the real API and worker.

The browser, the offline context (every request beyond loopback is aborted and fails the test,
as does an uncaught error in the page) and the service come from tests/support/browser.py.

Screenshots of the chat and the runs view go to ``tmp_path`` (and, with
``SOPHOS_SCREENSHOTS=DIR``, to DIR: that is how docs/screenshots/ was made).
"""

from __future__ import annotations

import re
import signal
import sqlite3
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.ollama import Drop, FakeOllama, Hang, Status, Text, ToolCalls
from tests.support.browser import Offline, Page, answers, conversation_of, expect, idle, screenshot, send
from tests.support.client import get_json, post_chat, read_sse, tool_calls, wait_for
from tests.support.env import SophosEnv, mcp_servers, not_safe_to_repeat, require_approval

# --- chat ------------------------------------------------------------------------------------


def test_the_answer_streams_as_markdown_with_tool_cards(
    service: Callable[..., str], offline: Offline, model: FakeOllama, tmp_path: Path
) -> None:
    url = service()
    hang = Hang(text="# Sums\n\nThe tool says **hello** and `x = 1`.\n\n", then=Text("- one\n- two\n"))
    model.script(ToolCalls([("tools__echo", {"text": "hello"})]), hang)
    page = offline.open(url)
    expect(page.locator("#empty")).to_be_visible()
    headers = httpx.get(f"{url}/", timeout=10).headers
    assert "script-src 'self'" in headers["content-security-policy"]
    send(page, "Say hello\nthrough the tool")

    card = page.locator("details.tool")
    expect(card.locator(".tool-name")).to_have_text("tools__echo")
    expect(card.locator(".tool-state")).to_have_text("done")
    card.locator("summary").click()
    expect(card.locator(".tool-args")).to_contain_text('"text": "hello"')
    expect(card.locator(".tool-result")).to_contain_text("hello")

    # Part of the answer is on screen while the model is still writing it.
    hang.wait_started(20)
    answer = answers(page).last
    expect(answer.locator("h1")).to_have_text("Sums")
    expect(answer.locator("strong")).to_have_text("hello")
    expect(answer.locator("code")).to_have_text("x = 1")
    expect(page.locator(".message.streaming")).to_have_count(1)
    expect(page.locator("#stop")).to_be_visible()
    hang.release()

    expect(answer.locator("li")).to_have_text(["one", "two"])
    idle(page)
    expect(page.locator(".message.user .bubble")).to_have_text("Say hello\nthrough the tool")
    conversation = conversation_of(page)
    item = page.locator(f'#conversations li[data-id="{conversation}"]')
    expect(item.locator(".title")).to_have_text("Say hello")
    expect(item.locator(".status")).to_have_text("completed")
    expect(page.locator("#conversation-status")).to_have_text("completed")
    expect(page.locator("#export-md")).to_have_attribute("href", f"/api/conversations/{conversation}/export")
    expect(page.locator("#export-jsonl")).to_have_attribute(
        "href", f"/api/conversations/{conversation}/export?format=jsonl"
    )
    expect(page.locator("#runs-view")).to_be_hidden()
    screenshot(page, tmp_path, "chat")

    # Usable at 375 px: the conversations fold away behind a button.
    page.set_viewport_size({"width": 375, "height": 740})
    expect(page.locator("#sidebar")).not_to_be_in_viewport()
    expect(page.get_by_label("Message")).to_be_in_viewport()
    page.get_by_role("button", name="Show conversations").click()
    expect(page.locator("#sidebar")).to_be_in_viewport()
    screenshot(page, tmp_path, "chat-375")
    page.set_viewport_size({"width": 1100, "height": 760})

    # The same conversation opened afresh shows the same thing, from the checkpoint.
    page.goto(f"{url}/#/c/{conversation}")
    page.reload()
    expect(answers(page).last.locator("li")).to_have_text(["one", "two"])
    expect(page.locator("details.tool .tool-result")).to_contain_text("hello")


HOSTILE = (
    "Look: <script>window.__pwned = 'script'</script> and "
    "<img src=x onerror=\"window.__pwned = 'img'\"> and [a link](javascript:window.__pwned='link') "
    "and ![pic](http://192.0.2.1/track.png) but **bold** is fine.\n\n"
    "<div onmouseover=\"window.__pwned = 'div'\">hover</div>\n"
)


def test_model_text_is_shown_never_run(
    service: Callable[..., str], offline: Offline, model: FakeOllama
) -> None:
    url = service()
    model.script(Text(HOSTILE))
    page = offline.open(url)
    send(page, "<b>mine</b> <img src=y onerror=\"window.__pwned = 'user'\">")
    answer = answers(page).last
    expect(answer.locator("strong")).to_have_text("bold")
    idle(page)

    text = answer.inner_text()
    assert "<script>window.__pwned = 'script'</script>" in text
    assert "<img src=x onerror=\"window.__pwned = 'img'\">" in text
    assert "<div onmouseover=" in text
    messages = page.locator("#messages")
    assert messages.locator("img").count() == 0
    assert messages.locator("script").count() == 0
    assert messages.locator("[onerror], [onmouseover]").count() == 0
    assert messages.locator('a[href^="javascript"]').count() == 0
    expect(page.locator(".message.user .bubble")).to_have_text(
        "<b>mine</b> <img src=y onerror=\"window.__pwned = 'user'\">"
    )
    page.locator(".message.assistant").hover()
    assert page.evaluate("window.__pwned") is None

    # Read back from the checkpoint (a reload), it is still text.
    page.reload()
    expect(answers(page).last.locator("strong")).to_have_text("bold")
    assert page.locator("#messages img, #messages script").count() == 0
    assert page.evaluate("window.__pwned") is None


def test_a_reload_mid_answer_shows_every_token_once(
    service: Callable[..., str], offline: Offline, model: FakeOllama
) -> None:
    url = service()
    words = [f"w{i}" for i in range(1, 121)]
    # Half the answer, then the model waits until the reloaded page follows the run (the reload's
    # first read starts a reader process: seconds on a loaded machine), then the rest.
    held = Hang(text=" ".join(words[:60]) + " ", then=Text(" ".join(words[60:]), token_delay=0.01))
    model.script(ToolCalls([("tools__echo", {"text": "before"})]), held)
    page = offline.open(url)
    send(page, "count slowly")
    expect(answers(page).last).to_contain_text("w15")
    held.wait_started(20)
    page.reload()
    # The page picks the run up where it is: the answer goes on streaming after the reload.
    expect(page.locator(".message.streaming")).to_have_count(1)
    expect(answers(page).last).to_contain_text("w60")
    held.release()
    expect(answers(page).last).to_contain_text("w120")
    idle(page)
    assert answers(page).count() == 1
    assert answers(page).last.inner_text().split() == words
    expect(page.locator("details.tool")).to_have_count(1)
    expect(page.locator(".message.user")).to_have_count(1)
    assert model.calls == 2


@pytest.mark.fault
def test_a_dropped_stream_resumes_with_last_event_id(
    sophos_env: SophosEnv, start_worker, start_api, offline: Offline, model: FakeOllama
) -> None:
    """The API process dies mid-answer and another takes its port: the browser's EventSource
    reconnects with ``Last-Event-ID`` and the page shows every token once."""
    words = [f"v{i}" for i in range(1, 101)]
    model.script(Text(" ".join(words), token_delay=0.04))
    start_worker(sophos_env)
    api = start_api(sophos_env)
    page = offline.open(api.url)
    send(page, "count while the API restarts")
    expect(answers(page).last).to_contain_text("v10")
    api.kill()
    assert api.wait(10) == -signal.SIGKILL
    second = start_api(sophos_env, port=int(sophos_env["API_PORT"]))
    expect(answers(page).last).to_contain_text("v100")
    idle(page)
    assert answers(page).last.inner_text().split() == words
    resumed = [r for r in second.log_records() if r.get("event") == "relay.opened"]
    assert resumed and all(r["after"] > 0 for r in resumed), resumed  # picked up after what was seen


@pytest.mark.fault
def test_an_interrupted_run_shows_why_and_resumes(
    sophos_env: SophosEnv, start_worker, start_api, offline: Offline, model: FakeOllama
) -> None:
    model.script(ToolCalls([("tools__slow", {"seconds": 1.5})]), Text("All **done**."))
    # Taken as a tool that acts: after the crash its call is asked about (tests/support/env.py).
    (sophos_env.root / "empty").mkdir(exist_ok=True)
    config = mcp_servers(sophos_env.tools_log, sophos_env.root / "empty")
    sophos_env.write_mcp_config(not_safe_to_repeat(config))
    worker = start_worker(sophos_env)
    api = start_api(sophos_env)
    page = offline.open(api.url)
    send(page, "do the slow thing")
    expect(page.locator("details.tool .tool-name")).to_have_text("tools__slow")

    wait_for(lambda: tool_calls(sophos_env.tools_log, "slow"), timeout=20)
    worker.kill()
    assert worker.wait(10) == -signal.SIGKILL
    start_worker(sophos_env)

    banner = page.locator('.banner[data-code="INTERRUPTED"]')
    expect(banner).to_be_visible()
    run = get_json(api.url, f"/api/runs?conversation={conversation_of(page)}")["runs"][0]
    expect(banner.locator(".message")).to_have_text(run["error"]["message"])
    expect(page.locator("#resume")).to_be_visible()

    # Opened later, the conversation still says why, and offers Resume.
    page.reload()
    expect(page.locator('.banner[data-code="INTERRUPTED"] .message')).to_have_text(run["error"]["message"])
    expect(page.locator("#conversation-status")).to_have_text("interrupted")
    # The card says what the resume will do with the call (the detail's resumePlan).
    expect(page.locator("details.tool .plan")).to_have_text(
        " · on resume: asked about first (it may already have run)"
    )
    page.get_by_role("button", name="Resume").click()
    expect(page.locator("details.tool .plan")).to_have_count(0)
    # The call in flight may have run: the resume asks before it is sent again.
    card = page.locator("fieldset.approval.uncertain")
    expect(card.locator(".uncertain-note")).to_contain_text("This call may already have run")
    expect(page.locator("#conversation-status")).to_have_text("waiting for approval")
    assert len(tool_calls(sophos_env.tools_log, "slow")) == 1
    card.get_by_label("Send again").check()
    page.get_by_role("button", name="Send decisions").click()
    expect(page.locator("details.tool .decision")).to_have_text("Decision: approved by you")
    expect(answers(page).last.locator("strong")).to_have_text("done")
    idle(page)
    expect(answers(page).last).to_have_text("All done.")
    expect(page.locator("#resume")).to_be_hidden()
    expect(page.locator(".banner")).to_have_count(0)
    expect(page.locator("#conversation-status")).to_have_text("completed")
    sent = tool_calls(sophos_env.tools_log, "slow")
    assert len(sent) == 2 and sent[0]["key"] == sent[1]["key"]  # once more, decided, with its key


def test_a_decided_call_says_its_decision_folded_also_when_the_tool_fails(
    service: Callable[..., str], sophos_env: SophosEnv, offline: Offline, model: FakeOllama
) -> None:
    require_approval(sophos_env, ["fail"])
    url = service()
    model.script(ToolCalls([("tools__fail", {"message": "out of paper"})]), Text("It failed."))
    page = offline.open(url)
    send(page, "print it")
    expect(page.locator("fieldset.approval")).to_have_count(1)
    idle(page)
    page.get_by_label("Approve").check()
    page.get_by_role("button", name="Send decisions").click()
    expect(answers(page).last).to_have_text("It failed.")
    idle(page)
    state = page.locator("details.tool .tool-state")
    expect(state).to_have_text("approved by you, then failed")  # the decision, not only "error"
    expect(page.locator("details.tool.tool-error")).to_have_count(1)
    page.reload()
    expect(state).to_have_text("approved by you, then failed")


def _gone_worker(url: str) -> dict[str, Any] | None:
    """The API's ``worker`` once it says none is alive."""
    worker: dict[str, Any] = get_json(url, "/api/runs?limit=1")["worker"]
    return None if worker["alive"] else worker


@pytest.mark.fault
def test_a_killed_worker_shows_within_two_seconds_and_resume_gives_one_answer(
    sophos_env: SophosEnv, start_worker, start_api, offline: Offline, model: FakeOllama, tmp_path: Path
) -> None:
    hang = Hang(text="The first half of the answer, ")
    model.script(hang, Text("The whole answer, once."))
    worker = start_worker(sophos_env)
    api = start_api(sophos_env)
    page = offline.open(api.url)
    send(page, "write it slowly")
    hang.wait_started(20)
    expect(answers(page).last).to_contain_text("The first half")
    worker.kill()
    assert worker.wait(10) == -signal.SIGKILL
    hang.release()
    gone: dict[str, Any] = wait_for(
        lambda: _gone_worker(api.url) or {}, timeout=20, message="the API to say the worker is gone"
    )
    # Told by the beating connection Redis dropped at the kill, not by the heartbeat's expiry
    # (10 s after the last beat; beats are 2 s apart): what lets the page say it within two seconds.
    assert gone["heartbeatAgeMs"] < 10_000, gone

    # Within two seconds of the API telling it, with no worker back yet.
    partial = page.locator(".message.assistant.interrupted")
    expect(partial.locator(".cut-label")).to_have_text("interrupted", timeout=2000)
    expect(page.locator('.banner[data-code="WORKER_GONE"]')).to_be_visible(timeout=2000)
    expect(partial.locator(".bubble")).to_have_text("The first half of the answer,")
    expect(page.locator("#conversation-status")).to_have_text("interrupted")
    # The list says so too (the API still has the run running), and Stop is gone: nothing to stop.
    expect(page.locator('#conversations a[aria-current="page"] .status')).to_have_text("interrupted")
    expect(page.locator("#stop")).to_be_hidden()
    screenshot(page, tmp_path, "interrupted")

    start_worker(sophos_env)
    expect(page.locator('.banner[data-code="INTERRUPTED"]')).to_be_visible()
    expect(page.locator('.banner[data-code="WORKER_GONE"]')).to_have_count(0)
    expect(partial).to_have_count(1)  # kept until the resume writes the answer again
    page.get_by_role("button", name="Resume").click()
    expect(answers(page).last).to_have_text("The whole answer, once.")
    idle(page)
    # One answer for the turn, as a reload shows it: the cut-off partial is gone.
    expect(answers(page)).to_have_text(["The whole answer, once."])
    expect(page.locator(".message.interrupted")).to_have_count(0)
    page.reload()
    expect(answers(page)).to_have_text(["The whole answer, once."])


def test_a_model_gone_mid_answer_is_marked_and_resume_gives_one_answer(
    service: Callable[..., str], offline: Offline, model: FakeOllama
) -> None:
    url = service()
    model.script(Drop(after_tokens=3, text="Half an answer before the model went away"))
    page = offline.open(url)
    send(page, "answer, if the model lets you")
    expect(page.locator('.banner[data-code="MODEL_UNAVAILABLE"]')).to_be_visible()
    idle(page)
    partial = page.locator(".message.assistant.interrupted")
    expect(partial.locator(".bubble")).to_have_text("Half an answer")
    expect(partial.locator(".cut-label")).to_have_text("interrupted")

    model.script(Text("A whole answer."))
    page.get_by_role("button", name="Resume").click()
    expect(answers(page).last).to_have_text("A whole answer.")
    idle(page)
    expect(answers(page)).to_have_text(["A whole answer."])
    expect(page.locator(".banner")).to_have_count(0)


def test_errors_show_the_apis_own_message(
    service: Callable[..., str], offline: Offline, model: FakeOllama
) -> None:
    url = service(RATE_LIMIT_PER_MINUTE=5)
    page = offline.open(url)

    # The model fails: the run's chat-error, as the API words it.
    model.script(Status(500, {"error": "model crashed"}))
    send(page, "hello?")
    banner = page.locator('.banner[data-code="MODEL_UNAVAILABLE"]')
    expect(banner).to_be_visible()
    conversation = conversation_of(page)
    events = read_sse(url, conversation)
    assert events[-1].event == "chat-error"
    expect(banner.locator(".message")).to_have_text(events[-1].data["message"])
    idle(page)

    # Busy: another client started a run of this conversation behind the page's back.
    hang = Hang(text="someone else's answer ")
    model.script(hang)
    response = post_chat(url, "from the command line", conversation)
    assert response.status_code == 202, response.text
    hang.wait_started(20)
    send(page, "and from the page")
    busy = page.locator('.banner[data-code="SESSION_IN_PROGRESS"]')
    expect(busy).to_be_visible()
    refused = post_chat(url, "again", conversation)
    assert refused.status_code == 409
    expect(busy.locator(".message")).to_have_text(refused.json()["error"]["message"])
    # ... and the page now shows that run streaming.
    expect(answers(page).last).to_contain_text("someone else's answer")
    expect(page.get_by_label("Message")).to_have_value("and from the page")  # nothing typed is lost
    hang.release()
    idle(page)

    # Rate limited: the sixth submission within a minute (four from the page, two from the test).
    send(page, "third from the page")
    idle(page)
    send(page, "one too many")
    limited = page.locator('.banner[data-code="RATE_LIMITED"] .message')
    expect(limited).to_contain_text("too many chat submissions from this address: at most 5 per minute")
    expect(page.get_by_label("Message")).to_have_value("one too many")


@pytest.mark.fault
def test_queue_down_is_a_banner(
    sophos_env: SophosEnv, start_redis, start_worker, start_api, offline: Offline, model: FakeOllama
) -> None:
    redis = start_redis(appendonly=False)
    env = sophos_env.with_(REDIS_URL=redis.url)
    start_worker(env)
    api = start_api(env)
    page = offline.open(api.url)
    expect(page.locator("#empty")).to_be_visible()
    redis.stop()
    send(page, "is anyone there?")
    banner = page.locator('.banner[data-code="QUEUE_UNAVAILABLE"] .message')
    expect(banner).to_have_text("the queue is unavailable, try again shortly")
    expect(page.get_by_label("Message")).to_have_value("is anyone there?")
    expect(page.locator("#send")).to_be_enabled()


def test_stop_cancels_the_run(
    service: Callable[..., str], sophos_env: SophosEnv, offline: Offline, model: FakeOllama
) -> None:
    url = service()
    hang = Hang(text="Let me look that up ", then=ToolCalls([("tools__echo", {"text": "never"})]))
    model.script(hang)
    page = offline.page()
    # By the name `localhost` too: the browser guard compares Origin with Host, and they agree.
    url = url.replace("127.0.0.1", "localhost")
    page.goto(url)
    send(page, "look it up")
    hang.wait_started(20)
    expect(answers(page).last).to_contain_text("Let me look that up")
    page.get_by_role("button", name="Stop").click()
    conversation = conversation_of(page)
    run = get_json(url, f"/api/runs?conversation={conversation}")["runs"][0]
    # Stop cuts the answer where it is: the model is still holding its stream open.
    expect(page.locator(".note")).to_have_text("Stopped.")
    idle(page)
    assert get_json(url, f"/api/runs/{run['id']}")["status"] == "cancelled"
    expect(page.locator("#conversation-status")).to_have_text("stopped")
    expect(answers(page).last).to_contain_text("Let me look that up")
    # The run has ended, and the worker has let go of the model's stream: the rest of the answer,
    # which asks for the tool, can reach nothing. (A graph left running behind the recorded end
    # would still be reading it, and run the tool once it came, whenever that is.)
    hang.wait_client_gone(20)
    hang.release()
    assert hang.finished.wait(20)
    assert tool_calls(sophos_env.tools_log) == []  # only now is "never ran" true for good
    # The cut answer says so, live and read back; it stays (the thread keeps it).
    expect(page.locator(".message.assistant.stopped .cut-label")).to_have_text("stopped")
    page.reload()
    expect(page.locator(".message.assistant.stopped .cut-label")).to_have_text("stopped")
    expect(answers(page)).to_have_count(1)


def test_the_sidebar_pages_and_delete_removes_a_conversation(
    service: Callable[..., str], sophos_env: SophosEnv, offline: Offline, model: FakeOllama
) -> None:
    url = service()
    # 34 older conversations, written as the worker writes them (the page asks 30 at a time).
    with sqlite3.connect(sophos_env.database_path) as db:
        db.executemany(
            "INSERT INTO conversations (id, title, created_at, updated_at, message_count)"
            " VALUES (?, ?, ?, ?, 2)",
            [(str(uuid.UUID(int=i + 1)), f"old {i:02d}", f"2026-01-01T00:00:{i:02d}.000Z",
              f"2026-01-01T00:00:{i:02d}.000Z") for i in range(34)],
        )
    model.script(Text("Soon gone."))
    page = offline.open(url)
    send(page, "delete me later")
    expect(answers(page).last).to_have_text("Soon gone.")
    idle(page)
    conversation = conversation_of(page)
    items = page.locator("#conversations li")
    expect(items).to_have_count(30)
    expect(items.first).to_have_attribute("data-id", conversation)  # newest first
    page.get_by_role("button", name="Older conversations").click()
    expect(items).to_have_count(35)
    expect(items.last.locator(".title")).to_have_text("old 00")
    expect(page.get_by_role("button", name="Older conversations")).to_be_hidden()

    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Delete").click()
    expect(page.locator(f'#conversations li[data-id="{conversation}"]')).to_have_count(0)
    wait_for(lambda: page.url.endswith("#/"), message="back to a new chat")
    response = httpx.get(f"{url}/api/conversations/{conversation}", timeout=10)
    assert response.status_code == 404 and response.json()["error"]["code"] == "NOT_FOUND"


# --- approvals -------------------------------------------------------------------------------


def approval_card(page: Page, arguments: str) -> Any:
    return page.locator("fieldset.approval").filter(has=page.locator(".tool-args", has_text=arguments))


def test_a_waiting_conversation_is_approved_and_rejected_in_the_page(
    service: Callable[..., str], sophos_env: SophosEnv, offline: Offline, model: FakeOllama, tmp_path: Path
) -> None:
    require_approval(sophos_env, ["add"])
    url = service()
    model.script(
        ToolCalls([("tools__add", {"a": 1, "b": 1}), ("tools__add", {"a": 2, "b": 2})]),
        Text("One sum done, the other refused."),
    )
    page = offline.open(url)
    send(page, "two sums")
    expect(page.locator("fieldset.approval")).to_have_count(2)
    idle(page)
    expect(page.locator("#conversation-status")).to_have_text("waiting for approval")
    assert tool_calls(sophos_env.tools_log) == []

    # A reload shows the same requests, from the conversation's pendingApproval.
    page.reload()
    first, second = approval_card(page, '"a": 1'), approval_card(page, '"a": 2')
    expect(first.locator(".tool-name")).to_have_text("tools__add")
    expect(page.locator("details.tool .tool-state")).to_have_text(["waiting for your decision"] * 2)
    # Every call needs a decision before anything is sent.
    page.get_by_role("button", name="Send decisions").click()
    expect(first.locator(".error-text")).to_have_text("choose Approve, Reject or Edit arguments")
    first.get_by_label("Approve").check()
    second.get_by_label("Reject").check()
    second.get_by_label("Reason (the model is told)").fill("not that one")
    screenshot(page, tmp_path, "approvals")
    page.get_by_role("button", name="Send decisions").click()

    # At once, before a reload: each card says what was decided; the rejected one is no error.
    decisions = page.locator("details.tool .decision")
    expect(decisions).to_have_text(["Decision: approved by you", "Decision: rejected by you: not that one"])
    expect(answers(page).last).to_have_text("One sum done, the other refused.")
    idle(page)
    expect(page.locator("fieldset.approval")).to_have_count(0)
    expect(page.locator("details.tool .tool-state")).to_have_text(["done", "rejected by you"])
    expect(page.locator("details.tool.tool-error")).to_have_count(0)
    expect(page.locator("#conversation-status")).to_have_text("completed")
    for summary in page.locator("details.tool summary").all():
        summary.click()  # open, to show the decision under the arguments
    expect(page.locator("details.tool .decision").first).to_be_visible()
    screenshot(page, tmp_path, "approvals-decided")
    assert [c["args"] for c in tool_calls(sophos_env.tools_log, "add")] == [{"a": 1, "b": 1}]
    results = [m for m in model.requests[1]["messages"] if m["role"] == "tool"]
    assert any("rejected" in r["content"] and "not that one" in r["content"] for r in results)
    # Opened afresh, each call says what was decided.
    page.reload()
    expect(page.locator("details.tool .decision")).to_have_text(
        ["Decision: approved by you", "Decision: rejected by you: not that one"]
    )
    expect(page.locator("details.tool .tool-state")).to_have_text(["done", "rejected by you"])
    expect(page.locator("details.tool.tool-error")).to_have_count(0)


def test_edited_arguments_are_checked_in_the_page_and_run(
    service: Callable[..., str], sophos_env: SophosEnv, offline: Offline, model: FakeOllama
) -> None:
    require_approval(sophos_env, True)
    url = service()
    hostile = '<img src=x onerror="window.__pwned=1">'
    model.script(ToolCalls([("tools__echo", {"text": hostile})]), Text("Echoed."))
    page = offline.open(url)
    send(page, "echo something")
    card = page.locator("fieldset.approval")
    expect(card.locator(".tool-args")).to_contain_text("<img src=x")  # shown as text
    card.get_by_label("Edit arguments").check()
    field = card.get_by_label("Arguments (JSON object)")
    field.fill("{not json")
    page.get_by_role("button", name="Send decisions").click()
    expect(card.locator(".error-text")).to_contain_text("not valid JSON")
    field.fill("[1, 2]")
    page.get_by_role("button", name="Send decisions").click()
    expect(card.locator(".error-text")).to_contain_text("must be a JSON object")
    field.fill('{"text": "edited"}')
    page.get_by_role("button", name="Send decisions").click()
    expect(page.locator("details.tool .decision")).to_have_text("Decision: edited by you before it ran")
    expect(answers(page).last).to_have_text("Echoed.")
    idle(page)
    assert [c["args"] for c in tool_calls(sophos_env.tools_log, "echo")] == [{"text": "edited"}]
    assert page.evaluate("window.__pwned") is None


# --- tokens ----------------------------------------------------------------------------------


def test_with_a_token_the_page_asks_once_and_streams_with_it(
    service: Callable[..., str], offline: Offline, model: FakeOllama
) -> None:
    url = service(API_TOKEN="s3cret-token")
    model.script(Text("Authorized **answer**."))
    page = offline.open(url)
    dialog = page.locator("#token-dialog")
    expect(dialog).to_be_visible()
    page.get_by_role("textbox", name="Key").fill("wrong")
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#token-error")).to_contain_text("the bearer token is not valid")
    page.get_by_role("textbox", name="Key").fill("s3cret-token")
    page.get_by_role("button", name="Sign in").click()
    expect(dialog).to_be_hidden()
    # API_TOKEN is the operator `api-token`, and a key to forget.
    expect(page.locator("#account-name")).to_have_text("api-token")
    expect(page.locator("#account-role")).to_have_text("operator")
    expect(page.get_by_role("button", name="Sign out")).to_be_visible()
    page.set_viewport_size({"width": 375, "height": 740})  # all of it fits at 375 px too
    expect(page.locator("#account-role")).to_be_in_viewport()
    expect(page.get_by_role("button", name="Sign out")).to_be_in_viewport()
    # One line high, as without a name: the folded sidebar opens just under it.
    header = page.locator(".topbar").evaluate("node => node.getBoundingClientRect().height")
    assert header <= page.locator("#sidebar").evaluate("node => parseFloat(getComputedStyle(node).top)")
    assert page.evaluate("document.documentElement.scrollWidth <= innerWidth")
    page.set_viewport_size({"width": 1100, "height": 760})

    send(page, "who may ask?")
    expect(answers(page).last.locator("strong")).to_have_text("answer")
    idle(page)
    conversation = conversation_of(page)
    assert page.evaluate("sessionStorage.getItem('sophos.token')") == "s3cret-token"
    expect(page.locator("#export-md")).to_have_attribute(
        "href", f"/api/conversations/{conversation}/export?access_token=s3cret-token"
    )

    # Kept for the tab: a reload asks nothing.
    page.reload()
    expect(page.locator(f'#conversations li[data-id="{conversation}"]')).to_be_visible()
    expect(answers(page).last).to_have_text("Authorized answer.")
    expect(dialog).to_be_hidden()


# --- operators -------------------------------------------------------------------------------


def test_the_runs_view_shows_the_queue_and_cancels(
    service: Callable[..., str], offline: Offline, model: FakeOllama, tmp_path: Path
) -> None:
    url = service()
    hang = Hang(text="slow ")
    model.script(hang, Text("second"))
    slow_conversation = post_chat(url, "the slow one").json()["conversation"]
    hang.wait_started(20)
    queued = post_chat(url, "waits behind it").json()

    page = offline.open(f"{url}/#/runs")
    expect(page.locator("#worker-state")).to_contain_text("Worker: alive")
    expect(page.locator("#readiness")).to_contain_text("Ready")
    running = page.locator("#runs-running tr[data-status=running]")
    expect(running).to_have_count(1)
    expect(running.locator(".node")).to_have_text("agent")
    expect(running.locator("a")).to_have_attribute("href", f"#/c/{slow_conversation}")
    waiting = page.locator(f'#runs-queued tr[data-run="{queued["run"]}"]')
    expect(waiting.locator(".position")).to_have_text("1")
    # It refreshes by itself: the time waited grows.
    first = float(waiting.locator(".waited").inner_text().split()[0])
    wait_for(lambda: float(waiting.locator(".waited").inner_text().split()[0]) > first + 1, timeout=20,
             message="the queued run's wait to grow on screen")
    screenshot(page, tmp_path, "runs")

    waiting.get_by_role("button", name="Cancel").click()
    finished = page.locator(f'#runs-finished tr[data-run="{queued["run"]}"]')
    expect(finished.locator(".outcome")).to_have_text("stopped")
    expect(page.locator("#runs-queued tr[data-run]")).to_have_count(0)
    assert get_json(url, f"/api/runs/{queued['run']}")["status"] == "cancelled"

    hang.release()
    expect(page.locator("#runs-running tr[data-run]")).to_have_count(0)
    expect(page.locator("#runs-finished tr[data-status=completed] .outcome")).to_have_text("completed")
    # Where its time went: held by the model for seconds, no tool called.
    parts = page.locator("#runs-finished tr[data-status=completed] .breakdown .part")
    took = r"(\d+ ms|\d+(\.\d)? s)"
    expect(parts).to_have_text([
        re.compile(f"^queued {took}$"), re.compile(r"^model \d+(\.\d)? s$"), "tools 0 ms",
        re.compile(f"^database {took}$"),
    ])


# --- the API documentation ------------------------------------------------------------------


def test_schema_renders_offline(service: Callable[..., str], offline: Offline) -> None:
    url = service()
    page = offline.open(f"{url}/schema")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("Sophos")
    expect(page.locator(".swagger-ui .opblock-summary-path").first).to_be_visible()
    assert page.locator(".swagger-ui .opblock").count() >= 10
