"""Every run concludes: whatever the database raises, the client gets a terminal event and the
conversation is freed; the outcome is written once the database takes it.

"Unavailable" (locked, full: ``sqlite3.OperationalError``) is covered in test_faults_infra.py.
Here the database raises something else, as a damaged file or a bug would: a trigger added
by the test beside the worker makes SQLite refuse one statement with ``RAISE(ABORT)``
(``sqlite3.IntegrityError``), until the test drops it (the database "works" again).
"""

from __future__ import annotations

import asyncio
import signal

import pytest

from tests.fakes.ollama import FakeOllama, Text
from tests.support.client import get_json, read_sse, read_sse_async, wait_for, wait_for_async
from tests.support.env import SophosEnv, mcp_servers
from tests.support.faults import accepted, execute, integrity
from tests.support.metrics import gauge

pytestmark = pytest.mark.fault

STREAM_TIMEOUT = 20.0
REFUSE_OUTCOMES = """
CREATE TRIGGER test_refuse_outcomes BEFORE UPDATE OF status ON runs WHEN NEW.status <> 'running'
BEGIN SELECT RAISE(ABORT, 'outcome refused by the test'); END
"""
REFUSE_RUNS = """
CREATE TRIGGER test_refuse_runs BEFORE INSERT ON runs
BEGIN SELECT RAISE(ABORT, 'run refused by the test'); END
"""


@pytest.fixture
def env(sophos_env: SophosEnv) -> SophosEnv:
    tools = mcp_servers(sophos_env.tools_log, sophos_env.root)["mcpServers"]["tools"]  # type: ignore[index]
    sophos_env.write_mcp_config({"mcpServers": {"tools": tools}})
    return sophos_env


def test_an_outcome_refused_with_an_error_other_than_unavailable_still_ends_the_run(
    env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    worker = start_worker(env)
    api = start_api(env).url
    model.script(Text("First answer."))
    conversation, first = accepted(api, "first")
    assert read_sse(api, conversation, timeout=STREAM_TIMEOUT)[-1].event == "end"

    execute(env.database_path, REFUSE_OUTCOMES)
    model.script(Text("Answered, not recorded."))
    _, run = accepted(api, "second", conversation)
    events = read_sse(api, conversation, timeout=STREAM_TIMEOUT)
    assert events[-1].event == "end", events.types
    assert events[-1].data == {"conversation": conversation, "run": run, "status": "completed"}
    assert events.text == "Answered, not recorded."
    worker.wait_for_log(lambda line: "run.outcome_deferred" in line and "IntegrityError" in line)
    assert get_json(api, f"/api/runs/{run}")["status"] == "running"  # not recorded yet

    # Freed: the next message is accepted at once. While the earlier outcome waits, the
    # worker refuses to start it (it would overtake that outcome), and says so.
    # (A refused run has no row: its record is its Redis description, which the API reads.)
    _, refused = accepted(api, "third", conversation)
    info = wait_for(
        lambda: (r := get_json(api, f"/api/runs/{refused}"))["status"] == "failed" and r,
        timeout=STREAM_TIMEOUT, message="the run refused while an earlier outcome waits",
    )
    assert info["error"]["code"] == "DATABASE_UNAVAILABLE"

    execute(env.database_path, "DROP TRIGGER test_refuse_outcomes")
    wait_for(
        lambda: get_json(api, f"/api/runs/{run}")["status"] == "completed",
        timeout=STREAM_TIMEOUT, message="the kept outcome recorded once the database takes it",
    )
    model.script(Text("Recorded again."))
    _, last = accepted(api, "fourth", conversation)
    events = read_sse(api, conversation, timeout=STREAM_TIMEOUT)
    assert events[-1].data == {"conversation": conversation, "run": last, "status": "completed"}
    assert get_json(api, f"/api/runs/{last}")["status"] == "completed"
    detail = get_json(api, f"/api/conversations/{conversation}")
    assert [m["content"] for m in detail["messages"]] == [
        "first", "First answer.", "second", "Answered, not recorded.", "fourth", "Recorded again.",
    ]
    assert get_json(api, f"/api/runs/{first}")["status"] == "completed"
    assert integrity(env.database_path) == "ok"


async def test_a_run_the_database_refuses_to_record_tells_the_client_and_frees_the_conversation(
    env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    worker = start_worker(env)
    api = start_api(env).url
    model.script(Text("First answer."))
    conversation, _ = accepted(api, "first")
    assert read_sse(api, conversation, timeout=STREAM_TIMEOUT)[-1].event == "end"

    execute(env.database_path, REFUSE_RUNS)
    # A client watching the run from before the worker takes it (a refused run has no row,
    # so once it is over the conversation's stream shows the run before it).
    worker.signal(signal.SIGSTOP)
    try:
        _, run = accepted(api, "not recorded", conversation)
        watcher = asyncio.create_task(read_sse_async(api, conversation, timeout=STREAM_TIMEOUT))
        await wait_for_async(lambda: gauge(api, "sophos_sse_subscribers") == 1,
                             message="the watcher connected")
    finally:
        worker.signal(signal.SIGCONT)
    events = await watcher
    assert events[-1].event == "chat-error", events.types
    assert events[-1].data["run"] == run and events[-1].data["code"] == "DATABASE_UNAVAILABLE"
    assert "send it again" in events[-1].data["message"]
    info = get_json(api, f"/api/runs/{run}")
    assert info["status"] == "failed" and info["error"]["code"] == "DATABASE_UNAVAILABLE"
    assert model.calls == 1  # nothing of it ran

    execute(env.database_path, "DROP TRIGGER test_refuse_runs")
    model.script(Text("Now recorded."))
    _, again = accepted(api, "sent again", conversation)  # the conversation was freed
    events = read_sse(api, conversation, timeout=STREAM_TIMEOUT)
    assert events[-1].data == {"conversation": conversation, "run": again, "status": "completed"}
    detail = get_json(api, f"/api/conversations/{conversation}")
    assert [m["content"] for m in detail["messages"]] == [
        "first", "First answer.", "sent again", "Now recorded.",
    ]
