"""The JSON Lines export read from the writes stored on each checkpoint (issue 44): real API,
worker and Redis, on SQLite and on PostgreSQL.

``GET /api/conversations/{id}/export?format=jsonl`` reads the branch oldest first, each
checkpoint's messages moved on from its parent's by the writes stored on the parent
(shared/storage/threads/history.py ``path``), where it used to build every state whole
(``lines_by_states``, kept for this comparison). Conversations written by the worker, of every
shape the export meets: tool calls approved, edited and rejected (the answer replaced under its
id), an edit and a regenerate (a fork), a run stopped mid-answer (its cut closed by
``update_state``), a long thread past several full copies of its messages
(``MESSAGES_SNAPSHOT_EVERY=4``), then the same threads pruned (the first kept checkpoint holds
every message). Each reads line for line as the states built whole read.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import msgspec
import psycopg
import pytest

from tests.fakes.ollama import FakeOllama, Hang, Text, ToolCalls
from tests.support.client import chat
from tests.support.conversations import detail, finish, post, say
from tests.support.env import SophosEnv
from tests.support.postgres import engine_overrides
from tests.support.redis_server import RedisServer
from tests.support.stacks import module_stack
from tests.test_pruning import export, prune


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_the_export_read_from_the_writes_is_the_export_of_the_states_built_whole(
    engine: str, request: pytest.FixtureRequest, tmp_path: Path, redis_server: RedisServer, model: FakeOllama,
) -> None:
    overrides = {"MESSAGES_SNAPSHOT_EVERY": "4", **engine_overrides(request, engine, short_lease=False)}
    with module_stack(tmp_path, redis_server.url, model, approval=["add"], **overrides) as stack:
        url = stack.env.api_url
        conversations = [decided_and_forked(url, model), stopped(url, model)]
        for conversation in conversations:
            same_lines(stack.env, conversation)
        assert prune(stack.env)["deleted"] > 0
        for conversation in conversations:
            same_lines(stack.env, conversation)


def decide(url: str, conversation: str, model: FakeOllama, decision: dict[str, Any], answer: str) -> None:
    """A turn whose call of ``add`` waits for a decision, then ``decision`` on it."""
    model.script(ToolCalls([("tools__add", {"a": 1, "b": 2})]))
    chat(url, "add them", conversation)
    assert finish(url, conversation) == "waiting"
    pending = detail(url, conversation)["pendingApproval"]
    model.script(Text(answer))
    body = {"conversation": conversation, "decisions": [{"id": pending[0]["id"], **decision}]}
    decided = post(url, "/api/chat", body)
    assert decided.status_code == 202, decided.text
    assert finish(url, conversation) == "completed"


def decided_and_forked(url: str, model: FakeOllama) -> str:
    model.script(*(Text(f"A{turn}") for turn in range(1, 7)))
    conversation = say(url, "turn 1")
    for turn in range(2, 7):
        say(url, f"turn {turn}", conversation)
    decide(url, conversation, model, {"action": "approve"}, "3")
    decide(url, conversation, model, {"action": "edit", "arguments": {"a": 20, "b": 30}}, "50")
    decide(url, conversation, model, {"action": "reject", "message": "not today"}, "as you wish")
    # An edit of turn 3 (a fork), continued; then a regenerate of the last answer (another).
    three = next(m for m in detail(url, conversation)["messages"] if m["content"] == "turn 3")
    model.script(Text("B3"), Text("B4"))
    body = {"conversation": conversation, "message": "turn 3, edited", "replaces": three["id"]}
    edit = post(url, "/api/chat", body)
    assert edit.status_code == 202, edit.text
    assert finish(url, conversation) == "completed"
    say(url, "turn 4 again", conversation)
    answer = detail(url, conversation)["messages"][-1]["id"]
    model.script(Text("B4 again"))
    again = post(url, "/api/chat", {"conversation": conversation, "regenerate": answer})
    assert again.status_code == 202, again.text
    assert finish(url, conversation) == "completed"
    return conversation


def stopped(url: str, model: FakeOllama) -> str:
    """A conversation whose run was stopped mid-answer, then went on for a few turns."""
    model.script(Text("A1"))
    conversation = say(url, "one")
    hang = Hang(text="thinking")
    model.script(hang)
    _, run = chat(url, "two", conversation)
    hang.wait_started()
    cancelled = httpx.post(f"{url}/api/runs/{run}/cancel", timeout=10, trust_env=False)
    assert cancelled.status_code == 202, cancelled.text
    assert finish(url, conversation) == "cancelled"
    hang.release()
    model.script(*(Text(f"A{turn}") for turn in range(3, 8)))
    for turn in range(3, 8):
        say(url, f"turn {turn}", conversation)
    return conversation


def same_lines(env: SophosEnv, conversation: str) -> None:
    """The conversation's export read both ways, in a reader's way (its saver, its serializer),
    on the branch the conversation follows; and the API's export has its lines."""
    from api.chat import branches
    from shared.storage.threads.branch import thread_at
    from shared.storage.threads.history import path
    from shared.storage.threads.snapshot import ThreadStates
    from shared.storage.threads.source import ThreadSource

    sql = "SELECT forked, branch_head FROM conversations WHERE id = ?"
    if "DATABASE_URL" in env:
        source = ThreadSource("postgresql", env["DATABASE_URL"])
        with psycopg.connect(env["DATABASE_URL"]) as conn:
            row = conn.execute(sql.replace("?", "%s"), (conversation,)).fetchone()
    else:
        source = ThreadSource("sqlite", f"{env.database_path.as_uri()}?mode=ro")
        with sqlite3.connect(f"{env.database_path.as_uri()}?mode=ro", uri=True) as conn:
            row = conn.execute(sql, (conversation,)).fetchone()
    assert row is not None
    forked, config = bool(row[0]), thread_at(conversation, row[1])

    def both(saver: Any) -> tuple[bytes, bytes, int]:
        graph = ThreadStates(saver)
        got, expected = branches.lines(forked, graph, config), branches.lines_by_states(forked, graph, config)
        light = sum(read.light for read in path(graph, thread_at(conversation)))
        return msgspec.json.encode(got), msgspec.json.encode(expected), light

    got, expected, light = source.read(both)
    lines = json.loads(got)[0]  # (the lines, the fork points)
    assert got == expected
    assert len(lines) > 2 and light >= len(lines) // 2, (len(lines), light)
    served = [json.loads(line) for line in export(env.api_url, conversation, True).splitlines()]
    assert [s["checkpoint_id"] for s in served] == [line["checkpoint_id"] for line in lines]
    def ids(lines: list[dict[str, Any]]) -> list[list[str]]:
        return [[m["id"] for m in line["messages"]] for line in lines]

    assert ids(served) == ids(lines)
