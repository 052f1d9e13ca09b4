"""Start-up survives damaged data (issue 11, part 3).

A worker that dies leaves ``running`` runs; the next one reconciles them before it
takes any job, and so reads what their threads hold. A damaged checkpoint (bytes
that are not msgpack, a pickle, metadata that is not JSON, a pending write that
cannot be decoded) must cost only its own conversation: that run is recorded
``interrupted`` and logged, the worker starts, every other conversation is served.
"""

from __future__ import annotations

import contextlib
import pickle
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
import redis as redis_sync
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from shared.redis.keys import ACTIVE_RUNS, events_key
from tests.fakes.ollama import FakeOllama, Text
from tests.support.client import get_json, read_sse, wait_for
from tests.support.env import SophosEnv, mcp_servers
from tests.support.faults import accepted, integrity
from worker.run.lifetime.recovery import input_recorded

pytestmark = pytest.mark.fault

Damage = Callable[[sqlite3.Connection, str, str], None]


def _garbage(conn: sqlite3.Connection, thread: str, checkpoint: str) -> None:
    conn.execute(
        "UPDATE checkpoints SET checkpoint = x'c1c1c1' WHERE thread_id = ? AND checkpoint_id = ?",
        (thread, checkpoint),
    )


def _pickled(conn: sqlite3.Connection, thread: str, checkpoint: str) -> None:
    conn.execute(
        "UPDATE checkpoints SET type = 'pickle', checkpoint = ? WHERE thread_id = ? AND checkpoint_id = ?",
        (pickle.dumps({"v": 1}), thread, checkpoint),
    )


def _metadata_not_json(conn: sqlite3.Connection, thread: str, checkpoint: str) -> None:
    conn.execute(
        "UPDATE checkpoints SET metadata = CAST('{\"run_id\": ' AS BLOB)"
        " WHERE thread_id = ? AND checkpoint_id = ?",
        (thread, checkpoint),
    )


def _bad_pending_write(conn: sqlite3.Connection, thread: str, checkpoint: str) -> None:
    conn.execute(
        "INSERT INTO writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, value)"
        " VALUES (?, '', ?, 'damaged-task', 0, 'messages', 'msgpack', x'c1')",
        (thread, checkpoint),
    )


DAMAGES: dict[str, Damage] = {
    "not msgpack": _garbage,
    "pickle": _pickled,
    "metadata not JSON": _metadata_not_json,
    "pending write not msgpack": _bad_pending_write,
}


def _latest_checkpoint(conn: sqlite3.Connection, thread: str) -> str:
    row = conn.execute(
        "SELECT checkpoint_id FROM checkpoints WHERE thread_id = ? ORDER BY checkpoint_id DESC LIMIT 1",
        (thread,),
    ).fetchone()
    assert row is not None, thread
    return str(row[0])


def test_damaged_checkpoints_cost_only_their_own_conversation_at_start_up(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    tools = mcp_servers(sophos_env.tools_log, sophos_env.root)["mcpServers"]["tools"]  # type: ignore[index]
    sophos_env.write_mcp_config({"mcpServers": {"tools": tools}})
    worker = start_worker(sophos_env)
    api = start_api(sophos_env).url
    names = [*DAMAGES, "intact orphan", "bystander"]
    model.script(*(Text(f"answer to {name}") for name in names))
    runs: dict[str, tuple[str, str]] = {}
    for name in names:
        runs[name] = accepted(api, name)
        assert read_sse(api, runs[name][0]).text == f"answer to {name}"
    assert worker.stop() == 0

    # As a worker killed mid-run leaves them: runs `running`, conversations claimed.
    orphans = [name for name in names if name != "bystander"]
    with contextlib.closing(sqlite3.connect(sophos_env.database_path, timeout=10)) as conn, conn:
        for name in orphans:
            conversation, run = runs[name]
            conn.execute("UPDATE runs SET status = 'running', finished_at = NULL WHERE id = ?", (run,))
            if name in DAMAGES:
                DAMAGES[name](conn, conversation, _latest_checkpoint(conn, conversation))
    client = redis_sync.Redis.from_url(sophos_env.redis_url, decode_responses=True)
    try:
        client.hset(ACTIVE_RUNS, mapping={runs[name][0]: runs[name][1] for name in orphans})

        worker = start_worker(sophos_env)
        for name in orphans:
            conversation, run = runs[name]
            info = get_json(api, f"/api/runs/{run}")
            assert info["status"] == "interrupted" and info["error"]["code"] == "INTERRUPTED", (name, info)
            if name in DAMAGES:
                assert "cannot be read" in info["error"]["message"], (name, info)
                worker.wait_for_log(lambda line, r=run: r in line and "run.state_unreadable" in line)
            else:
                assert "answer is complete" in info["error"]["message"], info
            assert client.hget(ACTIVE_RUNS, conversation) is None, name
            # Its stream ends again, after the end the test's own run had published.
            assert client.xrevrange(events_key(run), count=1)[0][1]["type"] == "chat-error", name
    finally:
        client.close()
    assert worker.alive

    # Every other conversation goes on, and new ones start.
    model.script(Text("still here"), Text("new one"))
    bystander = runs["bystander"][0]
    accepted(api, "and now?", bystander)
    assert read_sse(api, bystander).text == "still here"
    fresh, _ = accepted(api, "hello")
    assert read_sse(api, fresh).text == "new one"
    # The intact orphan's conversation too.
    model.script(Text("on we go"))
    intact = runs["intact orphan"][0]
    accepted(api, "next", intact)
    wait_for(lambda: read_sse(api, intact).text == "on we go", message="the intact orphan's next run")
    assert integrity(sophos_env.database_path) == "ok"


async def test_whether_a_run_was_checkpointed_is_told_without_decoding(tmp_path: Path) -> None:
    """The look reads no blob: it answers for a row whose checkpoint is garbage, and says
    "cannot tell" (None) rather than raise when the metadata itself is not JSON."""
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "c.db")) as saver:
        await saver.setup()
        await saver.conn.execute(
            "INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, type, checkpoint, metadata)"
            " VALUES ('t', '', '1', 'msgpack', x'c1', CAST('{\"run_id\": \"r\"}' AS BLOB)),"
            " ('u', '', '1', 'msgpack', x'c1', CAST('{\"run_id\": ' AS BLOB))"
        )
        await saver.conn.commit()
        t: RunnableConfig = {"configurable": {"thread_id": "t"}}
        u: RunnableConfig = {"configurable": {"thread_id": "u"}}
        assert await input_recorded(saver, t, "r") is True
        assert await input_recorded(saver, t, "other") is False
        assert await input_recorded(saver, u, "r") is None
