"""Faults of what the worker depends on: tool servers, the model, the database, Redis.

Injected from outside wherever possible: an MCP server that exits mid-call or
never answers, a command that does not exist, a model server that drops the
connection or is gone, another process holding SQLite's write lock, a
filesystem that is full, the test's own Redis stopped and started again.
"""

from __future__ import annotations

import errno
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import redis as redis_sync

from shared.redis.keys import ACTIVE_RUNS
from tests.fakes.ollama import Drop, FakeOllama, Hang, Text, ToolCalls
from tests.support.client import SseEvent, SseParser, get_json, post_chat, read_sse, tool_calls, wait_for
from tests.support.env import FAKES_DIR, SophosEnv, mcp_servers
from tests.support.faults import DatabaseLock, accepted, integrity, queue_is_clean
from tests.support.http import http_client
from tests.support.metrics import gauge
from tests.support.procs import pid_alive
from worker.store import connect, end_failed_transaction

pytestmark = pytest.mark.fault


def run_stream(api_url: str, conversation: str, run: str) -> list[SseEvent]:
    """The events of one run (``GET /api/chat?conversation=&run=``), up to its terminal one."""
    with http_client(base_url=api_url, timeout=30) as http:
        response = http.get("/api/chat", params={"conversation": conversation, "run": run})
    assert response.status_code == 200, response.text
    events = list(SseParser().feed_lines(response.text.splitlines()))
    assert events and events[-1].terminal, events
    return events


def tool_results(api_url: str, conversation: str) -> list[tuple[str, str, str]]:
    """(tool name, status, content) of every tool message of the conversation."""
    detail = get_json(api_url, f"/api/conversations/{conversation}")
    return [(m["name"], m.get("status", ""), m["content"]) for m in detail["messages"] if m["role"] == "tool"]


# --- MCP servers ---------------------------------------------------------------------------


@pytest.fixture
def fragile_env(sophos_env: SophosEnv) -> SophosEnv:
    """The fake tools, a server that dies or hangs on request, and one that cannot start."""
    tools = mcp_servers(sophos_env.tools_log, sophos_env.root)["mcpServers"]["tools"]  # type: ignore[index]
    sophos_env.write_mcp_config({"mcpServers": {
        "tools": tools,
        "fragile": {
            "command": sys.executable,
            "args": [str(FAKES_DIR / "fragile_server.py")],
            "env": {"TOOLS_LOG": str(sophos_env.tools_log)},
            # Taken as safe to repeat: a call that got no answer is sent once more with its key,
            # then its error is the model's (a call that acts is asked about: test_remote_tools.py).
            "safeToRepeat": True,
        },
        "ghost": {"command": str(sophos_env.root / "no-such-command"), "args": []},
    }})
    return sophos_env.with_(MCP_CALL_TIMEOUT=2)


def test_tool_server_that_dies_hangs_or_never_starts_costs_only_its_own_tools(
    fragile_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    start_worker(fragile_env)
    api = start_api(fragile_env)
    ready = get_json(api.url, "/api/readyz")
    servers = ready["checks"]["toolServers"]
    assert servers["tools"] == "up" and servers["fragile"] == "up"
    assert servers["ghost"] != "up" and "no-such-command" in servers["ghost"]

    # Dies in the middle of a call (sent once more, dies again), beside a call to a healthy server.
    model.script(ToolCalls([("fragile__die", {}), ("tools__echo", {"text": "still here"})]), Text("noted"))
    started = time.monotonic()
    conversation, _ = accepted(api.url, "die please")
    assert read_sse(api.url, conversation)[-1].event == "end"
    assert time.monotonic() - started < 15
    results = tool_results(api.url, conversation)
    # Each call is a task of its own: their results come in the order they finished.
    died, echoed = sorted(results)
    assert died[:2] == ("fragile__die", "error") and "fragile" in died[2]
    assert echoed == ("tools__echo", "success", "still here")

    # The next call gets a new session (a new server process).
    model.script(ToolCalls([("fragile__ping", {})]), Text("pong noted"))
    accepted(api.url, "ping", conversation)
    assert read_sse(api.url, conversation)[-1].event == "end"
    name, status, content = tool_results(api.url, conversation)[-1]
    assert (name, status) == ("fragile__ping", "success") and content.startswith("pong from ")
    first_pid = int(content.split()[-1])
    died = tool_calls(fragile_env.tools_log, "fragile.die")
    assert len(died) == 2 and first_pid not in {d["pid"] for d in died}  # sent once more, to a new server

    # Never answers: the model hears about it after MCP_CALL_TIMEOUT twice; echo is not held up.
    model.script(ToolCalls([("fragile__hang", {}), ("tools__echo", {"text": "quick"})]), Text("moving on"))
    started = time.monotonic()
    accepted(api.url, "hang please", conversation)
    assert read_sse(api.url, conversation)[-1].event == "end"
    assert time.monotonic() - started < 15
    hung, echoed = sorted(tool_results(api.url, conversation)[-2:])
    assert hung[:2] == ("fragile__hang", "error") and "did not answer within 2s" in hung[2]
    assert echoed == ("tools__echo", "success", "quick")

    model.script(ToolCalls([("fragile__ping", {})]), Text("pong again"))
    accepted(api.url, "ping again", conversation)
    assert read_sse(api.url, conversation)[-1].event == "end"
    name, status, content = tool_results(api.url, conversation)[-1]
    assert (name, status) == ("fragile__ping", "success")
    assert int(content.split()[-1]) != first_pid

    # The hung server was stopped, not left behind; the one that never started offers no tools.
    hung = [e["pid"] for e in tool_calls(fragile_env.tools_log, "fragile.hang")]
    assert len(hung) == 2
    wait_for(lambda: not any(pid_alive(p) for p in hung), timeout=10, message="the hung servers stopped")
    offered = {t["function"]["name"] for t in model.requests[-1].get("tools", [])}
    assert "tools__echo" in offered and "fragile__ping" in offered
    assert not any(name.startswith("ghost__") for name in offered)
    # The worker's next heartbeat (every 2 s) tells readyz the reopened session is up.
    ready = wait_for(
        lambda: (r := get_json(api.url, "/api/readyz"))["checks"]["toolServers"]["fragile"] == "up" and r,
        timeout=10,
    )
    assert "no-such-command" in ready["checks"]["toolServers"]["ghost"]
    assert queue_is_clean(fragile_env.redis_url, conversation) == []
    assert integrity(fragile_env.database_path) == "ok"


def taken(redis_url: str, run: str) -> bool:
    """arq marked the run's job in progress: a worker has it."""
    client = redis_sync.Redis.from_url(redis_url)
    try:
        return bool(client.exists(f"arq:in-progress:{run}"))
    finally:
        client.close()


# --- the database ----------------------------------------------------------------------------


def test_database_locked_briefly_the_run_waits_and_completes(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    start_worker(sophos_env)
    api = start_api(sophos_env)
    model.script(Text("waited for the lock"))
    with DatabaseLock(sophos_env.database_path) as lock:
        conversation, run = accepted(api.url, "are you there?")
        # The worker has taken the job and waits on SQLite to record it.
        wait_for(lambda: taken(sophos_env.redis_url, run), timeout=10)
        assert get_json(api.url, f"/api/runs/{run}")["status"] == "queued"  # not recorded yet
        assert model.calls == 0
        lock.release()
        events = read_sse(api.url, conversation)
    assert events[-1].event == "end" and events.text == "waited for the lock"
    assert integrity(sophos_env.database_path) == "ok"


def test_database_locked_too_long_fails_the_run_and_frees_the_conversation(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    worker = start_worker(sophos_env)
    api = start_api(sophos_env)
    hang = Hang(text="half ", then=Text("an answer"))
    model.script(hang, Text("an answer, resumed"))
    conversation, run = accepted(api.url, "question")
    hang.wait_started(20)

    with DatabaseLock(sophos_env.database_path):
        hang.release()
        # The step's checkpoint waits the busy timeout (5 s), then the run gives up.
        worker.wait_for_log("run.database_unavailable", timeout=20)
    # (An outcome the database refuses too is kept and written later: see the disk-full test.)
    events = read_sse(api.url, conversation)
    assert events[-1].event == "chat-error" and events[-1].data["code"] == "DATABASE_UNAVAILABLE"
    assert queue_is_clean(sophos_env.redis_url, conversation) == []
    info = get_json(api.url, f"/api/runs/{run}")
    assert info["status"] == "failed" and info["error"]["code"] == "DATABASE_UNAVAILABLE"
    assert integrity(sophos_env.database_path) == "ok"
    detail = get_json(api.url, f"/api/conversations/{conversation}")
    assert detail["resumable"] is True and [m["content"] for m in detail["messages"]] == ["question"]
    # The failed write left nothing behind on the worker's connection: the resume can write.
    accepted(api.url, conversation=conversation, resume=True)
    assert read_sse(api.url, conversation).text == "an answer, resumed"
    assert model.calls == 2


async def test_a_failed_write_is_rolled_back_or_its_stale_snapshot_fails_every_later_write(
    tmp_path: Path,
) -> None:
    """Why the worker rolls back the checkpointer's connection after a failed write."""
    path = tmp_path / "db.sqlite"
    saver, other = await connect(path), await connect(path)
    try:
        await saver.execute("PRAGMA busy_timeout=200")
        await saver.execute("CREATE TABLE t (x)")
        await saver.commit()
        with DatabaseLock(path), pytest.raises(sqlite3.OperationalError, match="locked"):
            await saver.execute("INSERT INTO t VALUES (1)")
        assert saver.in_transaction  # the failed write's transaction is still open...
        await (await saver.execute("SELECT count(*) FROM t")).fetchall()  # ...and now holds a snapshot
        await other.execute("INSERT INTO t VALUES (2)")
        await other.commit()
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            await saver.execute("INSERT INTO t VALUES (3)")  # no lock anywhere, yet "locked"
        await end_failed_transaction(saver)
        await saver.execute("INSERT INTO t VALUES (3)")
        await saver.commit()
    finally:
        await saver.close()
        await other.close()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs of the test's own, to fill up (needs root, as in CI)."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m,mode=0755", "tmpfs", str(mount)],
        capture_output=True, text=True, check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(directory: Path) -> Path:
    """Fill the filesystem of ``directory`` to the last byte; delete the file to free it."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as f:
        for size in (1 << 16, 1 << 12, 1):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc  # noqa: PT017 - the test's setup, not what it tests
    return filler


def test_disk_full_fails_the_run_keeps_the_database_and_resumes_once_freed(
    sophos_env: SophosEnv, small_disk: Path, start_worker, start_api, model: FakeOllama
) -> None:
    env = sophos_env.with_(DATABASE_PATH=small_disk / "db" / "sophos.db")
    start_worker(env)
    api = start_api(env)
    answer = "A long answer. " * 4000  # 60 KB: its checkpoint needs pages the disk no longer has
    pieces = [answer[i:i + 6000] for i in range(0, len(answer), 6000)]
    hang = Hang(then=Text(answer, tokens=pieces))
    model.script(hang, Text(answer, tokens=pieces))
    conversation, run = accepted(api.url, "write a lot")
    hang.wait_started(20)
    filler = fill(small_disk)
    hang.release()

    events = read_sse(api.url, conversation)
    assert events[-1].event == "chat-error" and events[-1].data["code"] == "DATABASE_UNAVAILABLE"
    assert queue_is_clean(env.redis_url, conversation) == []
    assert get_json(api.url, "/api/readyz")["status"] == "ready"
    # A new message cannot even be recorded: refused at once, nothing stored.
    refused, refused_run = accepted(api.url, "another")
    assert run_stream(api.url, refused, refused_run)[-1].data["code"] == "DATABASE_UNAVAILABLE"
    get_json(api.url, f"/api/conversations/{refused}", expect=404)
    # Its run has no row, yet it is not unknown: failed, with the reason, and finished.
    info = get_json(api.url, f"/api/runs/{refused_run}")
    assert info["status"] == "failed" and info["startedAt"] is None and info["finishedAt"]
    assert info["error"]["code"] == "DATABASE_UNAVAILABLE" and "send it again" in info["error"]["message"]
    cancel = httpx.post(f"{api.url}/api/runs/{refused_run}/cancel", trust_env=False, timeout=10)
    assert cancel.status_code == 409 and cancel.json()["error"]["code"] == "RUN_FINISHED"

    filler.unlink()
    # The outcome the full disk refused is recorded as soon as there is room.
    info = wait_for(
        lambda: (r := get_json(api.url, f"/api/runs/{run}"))["status"] != "running" and r, timeout=10
    )
    assert info["status"] == "failed" and info["error"]["code"] == "DATABASE_UNAVAILABLE"
    assert integrity(env.database_path) == "ok"
    detail = get_json(api.url, f"/api/conversations/{conversation}")
    assert detail["resumable"] is True and [m["role"] for m in detail["messages"]] == ["user"]

    _, resumed = accepted(api.url, conversation=conversation, resume=True)
    events = read_sse(api.url, conversation)
    assert events[-1].event == "end" and events[-1].data["run"] == resumed
    detail = get_json(api.url, f"/api/conversations/{conversation}")
    assert [m["content"] for m in detail["messages"]] == ["write a lot", answer]
    assert integrity(env.database_path) == "ok"


# --- the model -------------------------------------------------------------------------------


def test_model_gone_mid_stream_fails_the_run_and_it_resumes_once_the_model_is_back(
    sophos_env: SophosEnv, start_worker, start_api
) -> None:
    fake = FakeOllama(["test-model"]).start()  # our own, to stop and start again on its port
    try:
        env = sophos_env.with_(OLLAMA_HOST=fake.url)
        start_worker(env)
        api = start_api(env)
        fake.script(ToolCalls([("tools__echo", {"text": "kept"})]), Drop(after_tokens=2))
        conversation, run = accepted(api.url, "use a tool, then answer")
        events = read_sse(api.url, conversation)
        assert events[-1].event == "chat-error" and events[-1].data["code"] == "MODEL_UNAVAILABLE"
        assert events.text == "this reply "  # what was streamed before the drop
        info = get_json(api.url, f"/api/runs/{run}")
        assert info["status"] == "failed" and info["error"]["code"] == "MODEL_UNAVAILABLE"
        detail = get_json(api.url, f"/api/conversations/{conversation}")
        assert detail["resumable"] is True
        assert [m["role"] for m in detail["messages"]] == ["user", "assistant", "tool"]

        fake.close()  # now gone altogether: readyz says so, a resume fails the same way
        ready = get_json(api.url, "/api/readyz", expect=503)
        assert ready["checks"]["model"] is False and "model" in ready["error"]["message"]
        accepted(api.url, conversation=conversation, resume=True)
        assert read_sse(api.url, conversation)[-1].data["code"] == "MODEL_UNAVAILABLE"
        assert get_json(api.url, f"/api/conversations/{conversation}")["resumable"] is True

        fake = FakeOllama(["test-model"], port=fake.port).start()
        fake.script(Text("Back, and done."))
        get_json(api.url, "/api/readyz")
        accepted(api.url, conversation=conversation, resume=True)
        events = read_sse(api.url, conversation)
        assert events[-1].event == "end" and events.text == "Back, and done."
        detail = get_json(api.url, f"/api/conversations/{conversation}")
        assert [m["role"] for m in detail["messages"]] == ["user", "assistant", "tool", "assistant"]
        assert detail["resumable"] is False
        assert len(tool_calls(env.tools_log, "echo")) == 1  # the tool step was not repeated
    finally:
        fake.close()


# --- Redis -------------------------------------------------------------------------------------


def test_redis_restart_with_runs_queued_and_one_running(
    sophos_env: SophosEnv, start_redis, start_worker, start_api, model: FakeOllama
) -> None:
    server = start_redis()  # AOF on, like every deployment
    env = sophos_env.with_(REDIS_URL=server.url)
    worker, api = start_worker(env), start_api(env)
    hang = Hang(text="before the restart ", then=Text("and after it."))
    model.script(hang, Text("second"), Text("third"))
    first, _ = accepted(api.url, "first")
    hang.wait_started(20)
    queued = [accepted(api.url, text)[0] for text in ("second", "third")]
    seen = read_sse(api.url, first, stop_after=3)  # a client that goes away mid-run
    with ThreadPoolExecutor(1) as pool:
        # the first client is gone
        wait_for(lambda: gauge(api.url, "sophos_sse_subscribers") == 0, timeout=10)
        through = pool.submit(read_sse, api.url, first, timeout=60)  # one that stays connected
        wait_for(lambda: gauge(api.url, "sophos_sse_subscribers") == 1, timeout=10)

        server.restart(signal.SIGTERM, down_for=1.0)
        hang.release()
        stayed = through.result(60)

    rest = read_sse(api.url, first, seen.last_id)
    assert [(e.id, e.raw) for e in [*seen, *rest]] == [(e.id, e.raw) for e in stayed]
    assert stayed.text == "before the restart and after it." and stayed[-1].event == "end"
    for conversation, text in zip(queued, ("second", "third"), strict=True):
        events = read_sse(api.url, conversation)
        assert events[-1].event == "end" and events.text == text
    assert worker.alive and api.alive  # neither was restarted

    # Redis down at submit time: 503, and nothing half-recorded anywhere.
    before = get_json(api.url, "/api/conversations")["conversations"]
    server.stop()
    refused = post_chat(api.url, "while redis is down")
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "QUEUE_UNAVAILABLE"
    refused = post_chat(api.url, "follow-up while redis is down", first)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "QUEUE_UNAVAILABLE"
    server.start()
    assert get_json(api.url, "/api/conversations")["conversations"] == before
    assert queue_is_clean(env.redis_url, first) == []
    with server.client(decode_responses=True) as client:
        assert client.hgetall(ACTIVE_RUNS) == {}
    model.script(Text("fourth"))
    accepted(api.url, "after redis came back", first)
    assert read_sse(api.url, first).text == "fourth"
    assert worker.alive and api.alive


# --- the API ---------------------------------------------------------------------------------


def test_api_sigterm_ends_its_streams_cleanly_and_clients_resume_elsewhere(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    start_worker(sophos_env)
    leaving, staying = start_api(sophos_env), start_api(sophos_env)
    hang = Hang(text="first half ", then=Text("second half."))
    model.script(hang)
    conversation, _ = accepted(leaving.url, "long answer")
    hang.wait_started(20)

    events: list[SseEvent] = []
    with (
        http_client(base_url=leaving.url, timeout=30) as http,
        http.stream("GET", "/api/chat", params={"conversation": conversation}) as response,
    ):
        parser = SseParser()
        lines = response.iter_lines()
        while not any(e.event == "token" for e in events):
            events.extend(parser.feed_lines([next(lines)]))
        started = time.monotonic()
        leaving.terminate()
        # The stream ends properly (no broken chunk, no exception), without a terminal event.
        events.extend(parser.feed_lines(lines))
        ended_after = time.monotonic() - started
    assert not any(e.terminal for e in events)
    assert ended_after < 5
    # uvicorn re-raises the signal once its graceful shutdown is done.
    assert leaving.wait(10) in (0, -signal.SIGTERM)
    assert "api.stopping" in leaving.log_text()

    hang.release()
    rest = read_sse(staying.url, conversation, [e.id for e in events if e.id][-1])
    assert "".join(e.data for e in [*events, *rest] if e.event == "token") == "first half second half."
    ids = [int(e.id) for e in [*events, *rest] if e.id]
    assert ids == list(range(1, len(ids) + 1))
