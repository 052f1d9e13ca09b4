"""Branches: edit a user message, answer one again, switch back; real API, worker, Redis, SQLite.

One worker and one API for the module (each test makes its own conversations). The fake tools
server's tools are taken as not safe to repeat (so a call of one may have acted on the world),
and ``tools__add`` needs an approval.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.fakes.ollama import FakeOllama, Hang, Text, ToolCalls
from tests.support.client import chat, get_json, tool_calls
from tests.support.conversations import detail, finish, post, said, say
from tests.support.env import SophosEnv
from tests.support.redis_server import RedisServer
from tests.support.stacks import module_stack
from tests.test_cli import cli


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer, fake_ollama: FakeOllama
) -> Iterator[SophosEnv]:
    root = tmp_path_factory.mktemp("branches")
    with module_stack(root, redis_server.url, fake_ollama, approval=["add"], safe_to_repeat=False) as stack:
        yield stack.env


def accepted(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 202, response.text
    body: dict[str, Any] = response.json()
    return body


def refused(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["message"]
    return str(error["message"])


def test_an_edit_forks_the_thread_and_the_old_branch_can_be_followed_again(
    stack: SophosEnv, model: FakeOllama
) -> None:
    url = stack.api_url
    model.script(Text("A1"), Text("A2"), Text("B2"), Text("B3"))
    conversation = say(url, "one")
    say(url, "two", conversation)
    two = next(m for m in detail(url, conversation)["messages"] if m["content"] == "two")

    body = accepted(post(url, "/api/chat", {"conversation": conversation, "message": "two, edited",
                                            "replaces": two["id"]}))
    assert "abandonedCalls" not in body  # nothing acted on the branch it leaves
    assert finish(url, conversation) == "completed"
    # The model saw the thread before the edited message, then the edit: not the old answer.
    assert [(m["role"], m["content"]) for m in model.requests[-1]["messages"][1:]] == [
        ("user", "one"), ("assistant", "A1"), ("user", "two, edited"),
    ]
    now = detail(url, conversation)
    assert said(now, tools=False) == [
        ("user", "one"), ("assistant", "A1"), ("user", "two, edited"), ("assistant", "B2"),
    ]
    assert now["conversation"]["messageCount"] == 4
    edited = now["messages"][2]
    branch = edited["branch"]
    assert (branch["index"], branch["count"]) == (2, 2)
    assert [a["content"] for a in branch["alternatives"]] == ["two", "two, edited"]
    assert branch["alternatives"][0]["message"] == two["id"]
    assert branch["alternatives"][1]["message"] == edited["id"]
    assert all(a["actingCalls"] == [] for a in branch["alternatives"])
    assert "branch" not in now["messages"][0]  # no fork before the first message

    # The new branch goes on from its own head.
    say(url, "three", conversation)
    assert said(detail(url, conversation), tools=False)[-2:] == [("user", "three"), ("assistant", "B3")]

    # Back to the first branch: its messages, as they were, and it is the one continued.
    switched = accepted(post(url, f"/api/conversations/{conversation}/branch", {"message": two["id"]}))
    assert switched["conversation"] == conversation
    assert finish(url, conversation) == "completed"
    back = detail(url, conversation)
    assert said(back, tools=False) == [
        ("user", "one"), ("assistant", "A1"), ("user", "two"), ("assistant", "A2"),
    ]
    assert back["conversation"]["messageCount"] == 4
    assert back["messages"][2]["branch"]["index"] == 1
    runs = get_json(url, f"/api/runs?conversation={conversation}")["runs"]
    assert runs[0]["kind"] == "switch" and runs[0]["status"] == "completed"

    model.script(Text("A3"))
    say(url, "after switching back", conversation)
    assert [(m["role"], m["content"]) for m in model.requests[-1]["messages"][1:]] == [
        ("user", "one"), ("assistant", "A1"), ("user", "two"), ("assistant", "A2"),
        ("user", "after switching back"),
    ]
    assert said(detail(url, conversation), tools=False)[-1] == ("assistant", "A3")

    # Both exports follow the current branch and say where it forked.
    markdown = httpx.get(f"{url}/api/conversations/{conversation}/export", timeout=30, trust_env=False).text
    assert "after switching back" in markdown and "two, edited" in markdown  # named as the other branch
    assert "B3" not in markdown and "three" not in markdown
    assert "Branch 1 of 2" in markdown
    lines = [json.loads(line) for line in httpx.get(
        f"{url}/api/conversations/{conversation}/export?format=jsonl", timeout=30, trust_env=False
    ).text.splitlines()]
    contents = [m["content"] for line in lines for m in line["messages"]]
    assert "after switching back" in contents and "B2" not in contents and "two, edited" not in contents
    forks = [line for line in lines if "fork" in line]
    assert len(forks) == 1 and forks[0]["fork"]["index"] == 1 and forks[0]["fork"]["count"] == 2
    parents = {line["checkpoint_id"]: line["parent_checkpoint_id"] for line in lines}
    assert all(p is None or p in parents for p in parents.values())  # one path, root to head


def test_regenerate_answers_the_same_message_again_and_lists_calls_that_acted(
    stack: SophosEnv, model: FakeOllama
) -> None:
    url = stack.api_url
    model.script(
        ToolCalls([("tools__echo", {"text": "sent to the world"})]), Text("Echoed."),
        ToolCalls([("tools__echo", {"text": "once more"})]), Text("Echoed again."),
        Text("Plain."),
    )
    conversation = say(url, "first question")
    assert detail(url, conversation)["messages"][-1]["content"] == "Echoed."

    # The CLI answers the last message again, and says what the answer it leaves did.
    result = cli(stack.with_(SOPHOS_URL=url), "chat", "--regenerate", "--conversation", conversation)
    assert result.returncode == 0, result.stderr
    assert "Echoed again." in result.stdout
    assert "may have acted (its effects stay)" in result.stderr and "sent to the world" in result.stderr

    answer = detail(url, conversation)["messages"][-1]
    body = accepted(post(url, "/api/chat", {"conversation": conversation, "regenerate": answer["id"]}))
    left = [(c["name"], c["arguments"]) for c in body["abandonedCalls"]]
    assert left == [("tools__echo", {"text": "once more"})]
    assert finish(url, conversation) == "completed"
    now = detail(url, conversation)
    assert said(now, tools=False) == [("user", "first question"), ("assistant", "Plain.")]
    branch = now["messages"][0]["branch"]
    assert (branch["index"], branch["count"]) == (3, 3)
    assert [a["content"] for a in branch["alternatives"]] == ["first question"] * 3
    assert [[c["arguments"]["text"] for c in a["actingCalls"]] for a in branch["alternatives"]] == [
        ["sent to the world"], ["once more"], [],
    ]
    assert len(tool_calls(stack.tools_log, "echo")) == 2  # the effects stay; none was repeated
    markdown = httpx.get(f"{url}/api/conversations/{conversation}/export", timeout=30, trust_env=False).text
    assert "Branch 3 of 3" in markdown and "Branch 1 called `tools__echo`" in markdown
    assert "its effects stay" in markdown


def test_forks_are_refused_while_a_run_is_active_or_a_decision_is_pending_and_bad_ids_change_nothing(
    stack: SophosEnv, model: FakeOllama
) -> None:
    url = stack.api_url
    model.script(Text("first answer"))
    conversation = say(url, "hello")
    hello = detail(url, conversation)["messages"][0]["id"]

    hang = Hang(text="thinking")
    model.script(hang)
    chat(url, "second", conversation)
    hang.wait_started()
    edit = {"conversation": conversation, "message": "hi", "replaces": hello}
    refused(post(url, "/api/chat", edit), 409, "SESSION_IN_PROGRESS")
    switch = f"/api/conversations/{conversation}/branch"
    again = {"conversation": conversation, "regenerate": hello}
    refused(post(url, "/api/chat", again), 409, "SESSION_IN_PROGRESS")
    refused(post(url, switch, {"message": hello}), 409, "SESSION_IN_PROGRESS")
    hang.release()
    assert finish(url, conversation) == "completed"

    model.script(ToolCalls([("tools__add", {"a": 1, "b": 2})]))
    chat(url, "add them", conversation)
    assert finish(url, conversation) == "waiting"
    message = refused(post(url, "/api/chat", edit), 409, "APPROVAL_PENDING")
    assert "decision" in message
    refused(post(url, switch, {"message": hello}), 409, "APPROVAL_PENDING")
    pending = detail(url, conversation)["pendingApproval"]
    model.script(Text("3"))
    accepted(post(url, "/api/chat", {"conversation": conversation,
                                     "decisions": [{"id": pending[0]["id"], "action": "approve"}]}))
    assert finish(url, conversation) == "completed"
    before = detail(url, conversation)

    unknown = "00000000-0000-4000-8000-000000000000"
    assert "not on the current branch" in refused(
        post(url, "/api/chat", {**edit, "replaces": "no-such-message"}), 404, "NOT_FOUND"
    )
    refused(post(url, "/api/chat", {**edit, "conversation": unknown}), 404, "NOT_FOUND")
    refused(post(url, "/api/chat", {**edit, "conversation": "not-a-uuid"}), 400, "BAD_REQUEST")
    answer = before["messages"][1]["id"]
    not_users = refused(post(url, "/api/chat", {**edit, "replaces": answer}), 422, "NOT_FORKABLE")
    assert "not a user message" in not_users
    refused(post(url, "/api/chat", {**edit, "message": "  "}), 400, "BAD_REQUEST")
    refused(post(url, "/api/chat", {**edit, "regenerate": answer}), 400, "BAD_REQUEST")
    refused(post(url, "/api/chat", {"conversation": conversation, "regenerate": answer, "message": "x"}),
            400, "BAD_REQUEST")
    refused(post(url, "/api/chat", {"message": "x", "replaces": hello}), 400, "BAD_REQUEST")
    refused(post(url, switch, {"message": hello}), 404, "NOT_FOUND")  # no fork: no other branch
    refused(post(url, f"/api/conversations/{unknown}/branch", {"message": hello}), 404, "NOT_FOUND")
    refused(post(url, switch, {"nope": 1}), 400, "BAD_REQUEST")
    assert detail(url, conversation) == before  # nothing changed



def test_a_fork_cancelled_mid_answer_keeps_what_was_streamed_on_its_own_branch(
    stack: SophosEnv, model: FakeOllama
) -> None:
    url = stack.api_url
    model.script(Text("kept answer"))
    conversation = say(url, "question")
    question = detail(url, conversation)["messages"][0]["id"]

    hang = Hang(text="half an ")
    model.script(hang)
    run = accepted(post(url, "/api/chat", {"conversation": conversation, "message": "question, edited",
                                           "replaces": question}))["run"]
    hang.wait_started()
    assert httpx.post(f"{url}/api/runs/{run}/cancel", timeout=30, trust_env=False).status_code in (200, 202)
    assert finish(url, conversation) == "cancelled"
    now = detail(url, conversation)
    assert said(now, tools=False) == [("user", "question, edited"), ("assistant", "half an ")]
    assert now["messages"][1]["status"] == "stopped"
    alternatives = now["messages"][0]["branch"]["alternatives"]
    assert [a["content"] for a in alternatives] == ["question", "question, edited"]
