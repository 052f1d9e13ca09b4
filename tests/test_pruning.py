"""Checkpoint pruning (issue 44 part 3): real API, worker, Redis, on SQLite and on PostgreSQL.

One worker and one API per engine (each engine's test goes through every part in turn).
``MESSAGES_SNAPSHOT_EVERY=4``: a full copy of the messages every second turn, so a few turns
leave old steps to prune (with the default, 100 updates, it takes fifty turns). What is kept and
why: shared/storage/threads/pruning.py.
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.fakes.ollama import FakeOllama, Hang, Text, ToolCalls
from tests.support.client import chat, get_json, wait_for
from tests.support.conversations import detail, finish, post, said, say
from tests.support.env import SophosEnv
from tests.support.postgres import engine_overrides
from tests.support.redis_server import RedisServer
from tests.support.stacks import module_stack
from tests.test_cli import cli, ok


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_pruning(
    engine: str, request: pytest.FixtureRequest, tmp_path: Path, redis_server: RedisServer, model: FakeOllama,
) -> None:
    """One worker and one API per engine, for every part in turn (so each engine starts one stack)."""
    # Two runs at once: a prune's job is taken beside a live run.
    overrides = {"MESSAGES_SNAPSHOT_EVERY": "4", "WORKER_CONCURRENCY": "2",
                 **engine_overrides(request, engine, short_lease=False)}
    with module_stack(tmp_path, redis_server.url, model, approval=["add"], **overrides) as stack:
        keeps_both_branches_and_what_they_need(stack.env, model)
        leaves_a_live_run_alone(stack.env, model)
        if engine == "sqlite":  # the command and the route are the same on either engine
            sophos_prune_waits_and_an_unknown_prune_is_not_found(stack.env)


def export(url: str, conversation: str, jsonl: bool = False) -> str:
    params = {"format": "jsonl"} if jsonl else {}
    response = httpx.get(f"{url}/api/conversations/{conversation}/export", params=params, timeout=30,
                         trust_env=False)
    assert response.status_code == 200, response.text
    return response.text


def rows(env: SophosEnv, conversation: str, run: str | None = None) -> int:
    """The conversation's checkpoint rows (of one run's, with ``run``), read from the database."""
    if "DATABASE_URL" in env:
        sql = "SELECT count(*) FROM checkpoints WHERE thread_id = %s"
        if run is not None:
            sql += " AND metadata ->> 'run_id' = %s"
        with psycopg.connect(env["DATABASE_URL"]) as conn:
            found = conn.execute(sql, (conversation, run) if run else (conversation,)).fetchone()
    else:
        sql = "SELECT count(*) FROM checkpoints WHERE thread_id = ?"
        if run is not None:
            sql += " AND json_extract(CAST(metadata AS TEXT), '$.run_id') = ?"
        with sqlite3.connect(f"{env.database_path.as_uri()}?mode=ro", uri=True) as conn:
            found = conn.execute(sql, (conversation, run) if run else (conversation,)).fetchone()
    assert found is not None
    return int(found[0])


def prune(env: SophosEnv) -> dict[str, Any]:
    """``POST /api/checkpoints/prune``, then its progress until the worker is done."""
    started = post(env.api_url, "/api/checkpoints/prune")
    assert started.status_code == 202, started.text
    job = started.json()["job"]
    progress: dict[str, Any] = wait_for(
        lambda: (p := get_json(env.api_url, f"/api/checkpoints/prune/{job}"))["state"] != "running" and p,
        message=f"prune {job} done",
    )
    assert progress["state"] == "done", progress
    return progress


def keeps_both_branches_and_what_they_need(stack: SophosEnv, model: FakeOllama) -> None:
    url = stack.api_url
    model.script(Text("A1"), Text("A2"), Text("A3"), Text("A4"), Text("B4"), Text("B5"))
    conversation, first_run = chat(url, "one")
    assert finish(url, conversation) == "completed"
    for text in ("two", "three", "four"):
        say(url, text, conversation)
    four = next(m for m in detail(url, conversation)["messages"] if m["content"] == "four")
    edited = {"conversation": conversation, "message": "four, edited", "replaces": four["id"]}
    edit = post(url, "/api/chat", edited)
    assert edit.status_code == 202, edit.text
    assert finish(url, conversation) == "completed"
    say(url, "five", conversation)
    before, markdown = detail(url, conversation), export(url, conversation)
    lines = export(url, conversation, True).splitlines()
    count = rows(stack, conversation)
    assert rows(stack, conversation, first_run) > 0

    pruned = prune(stack)
    assert pruned["deleted"] > 0 and pruned["skipped"] == 0
    # The steps before the newest full copy above the fork point went: the first run's all of them.
    assert rows(stack, conversation) == count - pruned["deleted"]
    assert rows(stack, conversation, first_run) == 0
    # The conversation reads as before: messages, the fork and its alternatives, the transcript.
    after = detail(url, conversation)
    assert after["messages"] == before["messages"]
    assert said(after)[-4:] == [
        ("user", "four, edited"), ("assistant", "B4"), ("user", "five"), ("assistant", "B5"),
    ]
    assert [a["content"] for a in after["messages"][6]["branch"]["alternatives"]] == ["four", "four, edited"]
    assert export(url, conversation) == markdown
    # The checkpoint history keeps its newest steps, as they were; the oldest are gone.
    kept_lines = export(url, conversation, True).splitlines()
    assert 0 < len(kept_lines) < len(lines)
    old = [json.loads(line) for line in lines]
    got, newest = [json.loads(line) for line in kept_lines], old[-len(kept_lines):]
    assert got[1:] == newest[1:]
    # The oldest kept is the thread's first now: no parent, and every message so far as its own.
    earlier = [m for line in old[:len(old) - len(kept_lines) + 1] for m in line["messages"]]
    assert got[0] == {**newest[0], "parent_checkpoint_id": None, "messages": earlier}
    assert prune(stack)["deleted"] == 0  # nothing more to prune
    # The Agent Protocol reads a kept checkpoint, and knows no pruned one.
    state = f"{url}/threads/{conversation}/state"
    kept_state = httpx.get(f"{state}/{got[0]['checkpoint_id']}", timeout=30, trust_env=False)
    assert kept_state.status_code == 200, kept_state.text
    gone = httpx.get(f"{state}/{old[0]['checkpoint_id']}", timeout=30, trust_env=False)
    assert gone.status_code == 404 and "not found" in gone.text, gone.text

    # An old message before the kept checkpoints cannot be forked from, and says why.
    one = after["messages"][0]["id"]
    refused = post(url, "/api/chat", {"conversation": conversation, "regenerate": one})
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["code"] == "NOT_FORKABLE" and "pruned" in error["message"]

    # The old branch: switched back to, answered again, continued.
    switched = post(url, f"/api/conversations/{conversation}/branch", {"message": four["id"]})
    assert switched.status_code == 202, switched.text
    assert finish(url, conversation) == "completed"
    assert said(detail(url, conversation))[-2:] == [("user", "four"), ("assistant", "A4")]
    model.script(Text("A4 again"))
    answer = detail(url, conversation)["messages"][-1]["id"]
    again = post(url, "/api/chat", {"conversation": conversation, "regenerate": answer})
    assert again.status_code == 202, again.text
    assert finish(url, conversation) == "completed"
    now = detail(url, conversation)
    assert said(now)[-2:] == [("user", "four"), ("assistant", "A4 again")]
    assert len(now["messages"][6]["branch"]["alternatives"]) >= 2

    # A run waiting for an approval is left as it is, and its decision runs on.
    model.script(ToolCalls([("tools__add", {"a": 1, "b": 2})]))
    chat(url, "add them", conversation)
    assert finish(url, conversation) == "waiting"
    waiting = rows(stack, conversation)
    assert prune(stack)["skipped"] == 1
    assert rows(stack, conversation) == waiting
    pending = detail(url, conversation)["pendingApproval"]
    model.script(Text("3"))
    decided = post(url, "/api/chat", {"conversation": conversation,
                                      "decisions": [{"id": pending[0]["id"], "action": "approve"}]})
    assert decided.status_code == 202, decided.text
    assert finish(url, conversation) == "completed"
    assert said(detail(url, conversation))[-1] == ("assistant", "3")


def leaves_a_live_run_alone(stack: SophosEnv, model: FakeOllama) -> None:
    url = stack.api_url
    model.script(Text("A1"), Text("A2"), Text("A3"))
    conversation = say(url, "one")
    say(url, "two", conversation)
    say(url, "three", conversation)
    hang = Hang(text="thinking")
    model.script(hang)
    _, run = chat(url, "four", conversation)
    hang.wait_started()
    live = rows(stack, conversation)
    done = prune(stack)
    assert done["skipped"] == 1  # this conversation, its run running
    assert rows(stack, conversation) == live
    hang.release()
    assert finish(url, conversation) == "completed"
    assert said(detail(url, conversation))[-2:] == [("user", "four"), ("assistant", "thinking")]
    assert rows(stack, conversation, run) > 0
    # Once the run is over, the next prune takes the conversation's old steps.
    assert prune(stack)["deleted"] > 0
    assert said(detail(url, conversation))[:2] == [("user", "one"), ("assistant", "A1")]


def sophos_prune_waits_and_an_unknown_prune_is_not_found(stack: SophosEnv) -> None:
    printed = ok(cli(stack.with_(SOPHOS_URL=stack.api_url), "prune")).stdout
    assert re.fullmatch(
        r"pruned: \d+ conversations, \d+ checkpoints deleted, \d+ kept, \d+ skipped \(.*\)\n", printed
    ), printed
    missing = httpx.get(f"{stack.api_url}/api/checkpoints/prune/prune:nothing", timeout=10, trust_env=False)
    assert missing.status_code == 404, missing.text
    assert "no prune prune:nothing" in missing.json()["error"]["message"]
