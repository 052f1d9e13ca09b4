"""The API's reads of threads (issue 27): reader processes that end with the API, reads that
are bounded and stop when their client leaves, reads that never wait on SQLite's writer, and a
runs listing whose Redis commands do not grow with the queue but for each run's description.

Real API, worker, Redis and SQLite; the API's descendants are found through /proc.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import operator
import os
import signal
import struct
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import redis as redis_sync

from api.chat import approvals, branches
from api.http.readers import Readers
from api.protocol.runs import fork_reads
from api.protocol.threads import state
from api.store import READER_MODULES, READER_PROCESSES
from tests.fakes.ollama import FakeOllama, Text, ToolCalls
from tests.support.client import chat, get_json, read_sse, wait_for, wait_for_async
from tests.support.env import SophosEnv, require_approval
from tests.support.faults import DatabaseLock
from tests.support.http import http_client
from tests.support.procs import ServiceProcess, descendant_pids, pid_alive

#: SQLite's busy timeout on the API's read-only connections (api/store.py, ``timeout=5.0``):
#: a read that waited on the writer would wait this long, then fail.
BUSY_TIMEOUT_SECONDS = 5.0
#: How long the processes of a stopped API may take to notice and end.
ENDING_SECONDS = 15.0


def _conversation(api_url: str, message: str) -> str:
    conversation, _ = chat(api_url, message)
    assert read_sse(api_url, conversation)[-1].event == "end"
    return conversation


def _readers_started(api: ServiceProcess) -> list[int]:
    """The API's reader processes, once at least one has said it is ready."""
    api.wait_for_log("reader.started", timeout=60)
    return wait_for(lambda: api.descendants(), message="the API's reader processes")


def _idle_readers(api: ServiceProcess) -> int:
    """Readers started and not stopped since, by the API's log (once no read is in flight)."""
    events = [r.get("event") for r in api.log_records()]
    return events.count("reader.started") - events.count("reader.abandoned")


def _bytes_read(pid: int) -> int:
    """Bytes ``pid`` has read so far (``rchar``): a ready reader reads nothing until a read
    reaches its socket (its lifeline thread is blocked on a pipe that carries nothing)."""
    with open(f"/proc/{pid}/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def _ended(pids: list[int]) -> None:
    wait_for(
        lambda: not [pid for pid in pids if pid_alive(pid)], timeout=ENDING_SECONDS,
        message=lambda: f"these processes to end: {[pid for pid in pids if pid_alive(pid)]}",
    )


def _no_strays(api: ServiceProcess) -> None:
    """Nothing the API was seen to start is left (a reader still starting notices a moment later)."""
    wait_for(lambda: not api.stray_descendants(), timeout=ENDING_SECONDS,
             message=lambda: f"the API's processes to end: {api.stray_descendants()}")


def _loaded_langgraph(pid: int) -> bool:
    """Whether ``pid`` has loaded LangGraph: its checkpoint serializer's compiled ormsgpack and
    pydantic's core, under langchain's messages, show in the process's memory map (nothing else
    of the API's loads either)."""
    with open(f"/proc/{pid}/maps") as f:
        maps = f.read()
    return "ormsgpack" in maps and "pydantic_core" in maps


def _error_code(response: httpx.Response) -> str:
    return str(response.json()["error"]["code"])


# --- every process the API starts ends with it ----------------------------------------------


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=lambda s: s.name)
def test_the_api_s_processes_end_with_it(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama, how: signal.Signals
) -> None:
    """Stopped gracefully (exit by the re-raised signal) or killed alone (not its group): no
    reader and nothing of multiprocessing is left running."""
    start_worker(sophos_env)
    api = start_api(sophos_env)
    url = api.url or ""
    model.script(Text("kept"))
    conversation = _conversation(url, "hello")
    # The detail and the export read the thread in a reader process.
    detail = get_json(url, f"/api/conversations/{conversation}", timeout=60)
    assert [m["content"] for m in detail["messages"]] == ["hello", "kept"]
    assert "kept" in get_json(url, f"/api/conversations/{conversation}/export", timeout=60, raw=True)
    started = wait_for(lambda: descendant_pids(api.pid), message="the API's reader processes")
    api.descendants()  # remembered (with start times), as the API will be gone

    api.signal(how)
    api.wait(timeout=30)
    _ended(started)
    _no_strays(api)


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=lambda s: s.name)
def test_a_reader_busy_when_the_api_stops_ends_with_it(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama, how: signal.Signals
) -> None:
    """A read still in its reader when the API stops (a graceful stop gives up on it after its
    grace period; a kill leaves it to notice alone)."""
    start_worker(sophos_env)
    model.script(Text("kept"))
    conversation = _conversation(start_api(sophos_env).url or "", "hello")
    api = start_api(sophos_env.with_(SOPHOS_FAULT_HANG_READ=conversation))
    [reader] = _readers_started(api)

    def read() -> None:
        with contextlib.suppress(httpx.HTTPError):  # cut when the API stops
            httpx.get(f"{api.url}/api/conversations/{conversation}/export", timeout=60, trust_env=False)

    ready = _bytes_read(reader)
    with ThreadPoolExecutor(1) as pool:
        pool.submit(read)
        wait_for(lambda: _bytes_read(reader) > ready, timeout=30, message="the read to reach its reader")
        assert pid_alive(reader)
        api.signal(how)
        api.wait(timeout=30)
    _ended([reader])
    _no_strays(api)


# --- readers are sized to the load -----------------------------------------------------------


def test_reads_one_at_a_time_keep_one_reader_and_an_idle_one_is_stopped(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    """No spare beside a reader that is enough for the load (each holds ~90 MB); a reader idle
    for READER_IDLE_SECONDS is stopped, and the next read starts one again."""
    start_worker(sophos_env)
    model.script(Text("kept"))
    conversation = _conversation(start_api(sophos_env).url or "", "hello")
    api = start_api(sophos_env.with_(READER_IDLE_SECONDS=3))
    url = api.url or ""
    for path in (f"/api/conversations/{conversation}", f"/api/conversations/{conversation}/export") * 2:
        assert get_json(url, path, timeout=60, raw=path.endswith("export"))
    [reader] = api.descendants()  # the one started with the API served every read

    _ended([reader])  # idle for 3 s
    # The reader may end before the API has written why: wait for the line, not just the exit.
    stopped = api.wait_for_log(lambda line: "readers.idle_stopped" in line and str(reader) in line)
    assert reader in json.loads(stopped)["pids"], stopped
    detail = get_json(url, f"/api/conversations/{conversation}", timeout=60)
    assert [m["content"] for m in detail["messages"]] == ["hello", "kept"]
    assert len(api.descendants()) == 1


# --- reads are bounded and stop when their client leaves ------------------------------------


@pytest.fixture
def two_conversations(sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama) -> tuple[str, str]:
    """``(slow, other)``: two conversations, written by a worker through an API of their own."""
    start_worker(sophos_env)
    writer = start_api(sophos_env)
    model.script(Text("first"), Text("second"))
    return _conversation(writer.url or "", "slow one"), _conversation(writer.url or "", "other one")


def test_a_read_past_read_timeout_answers_503_and_frees_its_reader(
    sophos_env: SophosEnv, start_api, two_conversations: tuple[str, str]
) -> None:
    slow, other = two_conversations
    api = start_api(sophos_env.with_(READ_TIMEOUT=5, SOPHOS_FAULT_HANG_READ=slow))
    url = api.url or ""
    first_readers = _readers_started(api)

    # More reads of the slow thread than there are readers: each is answered within the bound
    # (the one that waited for a free reader too), none holds a reader afterwards.
    paths = [f"/api/conversations/{slow}"] * READER_PROCESSES + [f"/api/conversations/{slow}/export"]
    with ThreadPoolExecutor(len(paths)) as pool, http_client(base_url=url, timeout=60) as h:
        answers = list(pool.map(h.get, paths))
    for answer in answers:
        assert answer.status_code == 503, answer.text
        error = answer.json()["error"]
        assert error["code"] == "READ_TIMEOUT"
        assert slow in error["message"] and "READ_TIMEOUT" in error["message"]
    _ended(first_readers)  # stopped, not left reading

    # Others are served: the pool is not held by the reads that were given up, whose readers are
    # replaced (on a loaded machine a start alone can take longer than this short READ_TIMEOUT).
    wait_for(lambda: _idle_readers(api) > 0, timeout=60, message="a reader in place of those stopped")
    detail = get_json(url, f"/api/conversations/{other}", timeout=60)
    assert [m["content"] for m in detail["messages"]] == ["other one", "second"]
    assert len(api.descendants()) <= READER_PROCESSES
    assert any(r.get("event") == "reader.abandoned" for r in api.log_records())


def test_a_read_whose_client_left_stops_and_frees_its_reader(
    sophos_env: SophosEnv, start_api, two_conversations: tuple[str, str]
) -> None:
    slow, other = two_conversations
    # A bound far away: what stops the read below is its client leaving.
    api = start_api(sophos_env.with_(READ_TIMEOUT=600, SOPHOS_FAULT_HANG_READ=slow))
    url = api.url or ""
    [reader] = _readers_started(api)

    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes its connection
        httpx.get(f"{url}/api/conversations/{slow}/export", timeout=1.0, trust_env=False)
    _ended([reader])

    detail = get_json(url, f"/api/conversations/{other}", timeout=60)
    assert [m["content"] for m in detail["messages"]] == ["other one", "second"]
    records = api.log_records()
    assert any(r.get("event") == "reader.abandoned" and r.get("pid") == reader for r in records)
    assert any(r.get("event") == "request" and r.get("outcome") == "client_disconnected" for r in records)


# --- reads never wait on SQLite's writer ------------------------------------------------------


def test_reads_and_a_decision_answer_while_another_process_holds_the_write_lock(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    """Each answer arrives while the lock is still held and sooner than SQLite's busy timeout
    (what a read waiting on the writer would wait), from a reader started with the API: no
    request pays for starting one (that was the second a decision took)."""
    require_approval(sophos_env, ["add"])
    start_worker(sophos_env)
    model.script(ToolCalls([("tools__add", {"a": 2, "b": 3})]), Text("5"))
    conversation = _conversation(start_api(sophos_env).url or "", "add 2 and 3")

    api = start_api(sophos_env)  # a fresh API process: it has read nothing yet
    readers = _readers_started(api)
    # Ready means LangGraph is loaded: no read pays for importing it (api/store.py READER_MODULES).
    assert all(_loaded_langgraph(pid) for pid in readers)
    timings: dict[str, float] = {}
    with DatabaseLock(sophos_env.database_path) as lock, http_client(
        base_url=api.url or "", timeout=2 * BUSY_TIMEOUT_SECONDS, trust_env=False
    ) as http:

        def timed(name: str, method: str, path: str, body: Any = None) -> httpx.Response:
            began = time.monotonic()
            response = http.request(method, path, json=body)
            timings[name] = time.monotonic() - began
            assert lock.proc.poll() is None  # answered while the writer still holds the lock
            return response

        detail = timed("detail", "GET", f"/api/conversations/{conversation}")
        assert detail.status_code == 200, detail.text
        [request] = detail.json()["pendingApproval"]
        export = timed("export", "GET", f"/api/conversations/{conversation}/export")
        assert export.status_code == 200, export.text
        message = timed("message", "POST", "/api/chat", {"conversation": conversation, "message": "and 4?"})
        assert _error_code(message) == "APPROVAL_PENDING"
        wrong = timed("wrong decision", "POST", "/api/chat",
                      {"conversation": conversation, "decisions": [{"id": "nope", "action": "approve"}]})
        assert wrong.status_code == 400, wrong.text
        approve = [{"id": request["id"], "action": "approve"}]
        decided = timed("decision", "POST", "/api/chat", {"conversation": conversation, "decisions": approve})
        assert decided.status_code == 202, decided.text
        assert max(timings.values()) < BUSY_TIMEOUT_SECONDS, timings
        # No read started a process: the reader was there before the first request.
        assert set(readers) <= set(api.descendants())
    assert read_sse(api.url or "", conversation)[-1].data["status"] == "completed"
    # The API's main process, which only sent the reads and formatted what came back, never
    # loaded LangGraph or langchain (api/store.py).
    assert not _loaded_langgraph(api.pid)


# --- the runs listing --------------------------------------------------------------------------


def _commands(client: redis_sync.Redis) -> dict[str, int]:
    stats: Any = client.info("commandstats")  # the sync client: a dict
    return {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()}


def _listing_commands(client: redis_sync.Redis, url: str, queued: int) -> dict[str, int]:
    before = _commands(client)
    listing = get_json(url, "/api/runs?limit=500")
    after = _commands(client)
    assert [r["status"] for r in listing["runs"]] == ["queued"] * queued
    delta = {name: calls - before.get(name, 0) for name, calls in after.items()}
    return {name: calls for name, calls in delta.items() if calls}


def test_the_runs_listing_asks_redis_one_command_per_queued_run_at_most(
    sophos_env: SophosEnv, start_api, redis_sync_client: redis_sync.Redis
) -> None:
    """No worker: every run stays queued. Each queued run costs its description (one HGETALL in
    one pipeline) and nothing more; in particular no EXISTS per run."""
    api = start_api(sophos_env.with_(RATE_LIMIT_PER_MINUTE=0))
    url = api.url or ""
    for _ in range(5):
        chat(url, "queued")
    few = _listing_commands(redis_sync_client, url, 5)
    for _ in range(40):
        chat(url, "queued")
    many = _listing_commands(redis_sync_client, url, 45)
    assert "exists" not in many, many
    assert sum(many.values()) - sum(few.values()) <= 40, (few, many)


def _a_reply_that_trickles_on() -> None:
    """Run in a reader: start a reply that never ends, sent a byte at a time by a child of the
    reader, which outlives it (it holds the reader's socket) until the API's end is closed."""
    fd = int(sys.argv[1])  # the reader's socket (api/http/reader_process.py ``serve``)
    os.write(fd, struct.pack("!i", 1 << 20))
    if os.fork() == 0:
        with contextlib.suppress(OSError):
            for _ in range(6000):  # at most a minute, should the API never close its end
                os.write(fd, b"x")
                time.sleep(0.01)
        os._exit(0)
    time.sleep(3600)


async def test_reads_after_a_read_abandoned_mid_reply_get_their_own_replies() -> None:
    """A read abandoned while its reply is coming in (its client left; past READ_TIMEOUT, the
    same) leaves its receiving thread reading. That thread must never read the socket of a
    reader started after (which is often given the same descriptor number): it is woken by the
    socket's shutdown, and the descriptor is closed only once it has returned."""
    readers = Readers(size=1, timeout=30.0)
    try:
        read = asyncio.create_task(readers.run(_a_reply_that_trickles_on, what="a reply that never ends"))
        # The reply's first bytes are on their way: the reader has started its child.
        await wait_for_async(
            lambda: any(descendant_pids(pid) for pid in readers.pids), timeout=30,
            message="the reader's trickling child",
        )
        read.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await read
        for i in range(5):
            assert await readers.run(operator.add, i, 1, what="a sum") == i + 1
    finally:
        await readers.aclose()


# --- what a reader loads ---------------------------------------------------------------------

#: What a reader never imports: the web framework, the queue and its Redis client, the API's own
#: database side and store. Each would cost every reader its memory for nothing (bench figure 16).
NOT_IN_A_READER = ("litestar", "uvicorn", "redis", "arq", "aiosqlite", "structlog", "psycopg_pool")
NOT_IN_A_READER_MODULES = (
    "api.store", "api.app", "shared.storage.reading", "api.protocol.runs.forks", "api.protocol.runs.service",
)
#: Every function the API sends its readers (``Store.read_thread``'s reads).
READS = (
    branches.current, branches.lines, branches.plan, branches.switch_target, approvals.pending_requests,
    state.thread_state, state.thread_state_at, state.thread_history, state.pending_of,
    fork_reads.checkpoint_at, fork_reads.run_started,
)


async def test_a_reader_loads_what_reads_need_and_nothing_of_the_apis_service() -> None:
    """A reader started as the API starts one (its modules preloaded) then sent a read: the
    modules it holds are the reads' and LangGraph's, none of the API's service machinery."""
    assert {read.__module__ for read in READS} <= set(READER_MODULES)  # no read imports on first use
    readers = Readers(size=1, timeout=60.0, preload=READER_MODULES)
    try:
        # A builtin, so the read itself imports nothing; it names no input, only a constant.
        loaded: list[str] = await readers.run(
            eval, "sorted(__import__('sys').modules)", what="the reader's modules"
        )
    finally:
        await readers.aclose()
    assert "langgraph.checkpoint.sqlite" in loaded and "api.thread_read" in loaded  # it did preload
    found = sorted(
        m for m in loaded if m.split(".")[0] in NOT_IN_A_READER or m in NOT_IN_A_READER_MODULES
    )
    assert not found, found

