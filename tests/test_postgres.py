"""PostgreSQL with several workers: one executor per run, leases that lapse, fencing that holds.

Real workers on the machine's PostgreSQL (a fresh database per test), killed and paused with
real signals. The lease is 3 s here (``sophos_env``): a dead or paused worker's run must be
recorded ``interrupted`` by a live worker within the lease plus one pass (a third of it).
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from typing import Any

import psycopg
import pytest
from redis.asyncio import Redis

from api.store import WAITING_COUNT_SQL
from shared.contracts.jobs import JobKind, RunJob
from shared.redis.keys import ACTIVE_RUNS, arq_in_progress_key, waiting_key
from shared.redis.liveness import new_worker_id
from shared.settings import Settings
from shared.storage.engines import open_checkpointer, open_database
from shared.storage.postgres import migrate
from shared.storage.threads.state import reader_graph
from tests.fakes.ollama import FakeOllama, Hang, Text, ToolCalls
from tests.support.client import (
    chat,
    get_json,
    post_chat,
    post_chat_async,
    read_sse,
    tool_calls,
    wait_for,
    wait_for_async,
)
from tests.support.env import SophosEnv
from tests.support.procs import ServiceProcess
from worker.run.service import RunService
from worker.run.turns import take_turn
from worker.store import RunStore

LEASE = 3.0


@pytest.fixture
def backend() -> str:
    return "postgresql"


def started_runs(worker: ServiceProcess) -> list[str]:
    return [r["run_id"] for r in worker.log_records() if r.get("event") == "run.started"]


def run_record(api_url: str, run: str) -> dict[str, Any]:
    return get_json(api_url, f"/api/runs/{run}")


def recorded(api_url: str, run: str, timeout: float) -> dict[str, Any]:
    return wait_for(
        lambda: (info := run_record(api_url, run))["status"] != "running" and info,
        timeout=timeout, message=f"run {run} recorded",
    )


def checkpoint_rows(url: str, conversation: str) -> tuple[int, int]:
    with psycopg.connect(url) as conn:
        checkpoints = conn.execute("SELECT count(*) FROM checkpoints WHERE thread_id = %s", (conversation,))
        count = checkpoints.fetchone()
        writes = conn.execute("SELECT count(*) FROM checkpoint_writes WHERE thread_id = %s", (conversation,))
        written = writes.fetchone()
    assert count is not None and written is not None
    return int(count[0]), int(written[0])


def test_two_workers_share_twenty_conversations_each_run_executed_once(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    env = sophos_env.with_(WORKER_CONCURRENCY=2)
    # Each answer takes a while, so both workers are busy at once.
    model.answer_by(lambda body: Text("shared answer", token_delay=0.05))
    workers = [start_worker(env), start_worker(env)]
    api = start_api(env)
    posted = [post_chat(api.url, f"conversation {i}") for i in range(20)]
    assert all(r.status_code == 202 for r in posted), [r.text for r in posted]
    runs = {r.json()["conversation"]: r.json()["run"] for r in posted}
    for conversation, run in runs.items():
        events = read_sse(api.url, conversation, timeout=60)
        assert events[-1].event == "end" and events[-1].data["run"] == run
        assert events.text == "shared answer"

    executed = [started_runs(w) for w in workers]
    assert sorted(executed[0] + executed[1]) == sorted(runs.values())  # each exactly once
    assert executed[0] and executed[1], "both workers took runs"
    assert model.calls == 20
    listed = get_json(api.url, "/api/conversations?limit=50")["conversations"]
    assert len(listed) == 20 and {c["status"] for c in listed} == {"completed"}
    assert not env.database_path.exists()  # all of it in PostgreSQL


def test_a_killed_workers_run_is_interrupted_by_the_other_within_the_lease(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    hang = Hang(text="working ")
    model.script_for("doomed", ToolCalls([("tools__echo", {"text": "before"})]), hang, Text("resumed"))
    doomed = start_worker(sophos_env)
    api = start_api(sophos_env)
    conversation, run = chat(api.url, "doomed run")
    hang.wait_started(20)
    survivor = start_worker(sophos_env)

    doomed.kill()
    killed_at = time.monotonic()
    assert doomed.wait(10) == -signal.SIGKILL
    info = recorded(api.url, run, timeout=LEASE * 3 + 10)
    # Within the lease plus one pass (and the time to tell), by the live worker.
    assert time.monotonic() - killed_at < LEASE + LEASE / 3 + 3
    assert info["status"] == "interrupted" and info["error"]["code"] == "INTERRUPTED"
    assert survivor.wait_for_log(lambda line: run in line and "run.interrupted_by_crash" in line)
    stream = read_sse(api.url, conversation)
    assert stream[-1].event == "chat-error" and stream[-1].data["code"] == "INTERRUPTED"
    assert get_json(api.url, f"/api/conversations/{conversation}")["resumable"] is True
    assert run not in started_runs(survivor)  # recorded, never executed again by itself

    # The survivor serves others meanwhile, and resumes the interrupted one.
    model.script_for("other", Text("unaffected"))
    other, _ = chat(api.url, "other conversation")
    assert read_sse(api.url, other).text == "unaffected"
    _, resumed = chat(api.url, conversation=conversation, resume=True)
    events = read_sse(api.url, conversation)
    assert events[-1].event == "end" and events[-1].data["run"] == resumed
    assert resumed in started_runs(survivor)
    assert len(tool_calls(sophos_env.tools_log, "echo")) == 1  # the finished step is not repeated


def test_a_worker_paused_past_its_lease_writes_nothing_when_it_continues(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    url = sophos_env["DATABASE_URL"]
    hang = Hang(text="slow ", then=ToolCalls([("tools__echo", {"text": "late"})]))
    model.script_for("paused", hang, Text("finished elsewhere"))
    paused = start_worker(sophos_env)
    api = start_api(sophos_env)
    conversation, run = chat(api.url, "paused run")
    hang.wait_started(20)
    other = start_worker(sophos_env)

    paused.signal(signal.SIGSTOP)
    try:
        info = recorded(api.url, run, timeout=LEASE * 3 + 10)
        assert info["status"] == "interrupted"
        before = checkpoint_rows(url, conversation)
        hang.release()  # the model step the paused worker was in completes: it will try to save it
    finally:
        paused.signal(signal.SIGCONT)
    paused.wait_for_log(lambda line: run in line and "run.dropped" in line, timeout=20)

    assert checkpoint_rows(url, conversation) == before  # no write of the stale worker landed
    assert run_record(api.url, run) == info  # its outcome neither
    assert tool_calls(sophos_env.tools_log) == []  # nor did its tool call run
    stream = read_sse(api.url, conversation)
    assert [e.event for e in stream if e.event in ("end", "chat-error")] == ["chat-error"]  # once
    assert paused.alive  # the stale worker goes on serving

    _, resumed = chat(api.url, conversation=conversation, resume=True)
    assert read_sse(api.url, conversation)[-1].data["run"] == resumed
    assert resumed in started_runs(other) + started_runs(paused)


async def test_a_worker_paused_inside_a_transaction_does_not_hold_the_takeover_past_its_lease(
    sophos_env: SophosEnv,
) -> None:
    """A worker stopped between a write and its commit (SIGSTOP, a frozen VM) holds that write's
    row locks; its lease renewal locks the run's row, so the worker taking the lapsed run over
    waited on it for as long as the pause lasted (CI met it: the paused-worker test above timed
    out with the run still ``running``). The server ends a worker's transaction left idle past
    the lease (shared/storage/postgres.py), and the takeover goes on. The paused worker here is
    this test: a worker's own store, its renewal's statement sent and never committed."""
    settings = Settings.from_env(sophos_env)
    await migrate(sophos_env["DATABASE_URL"])
    paused = RunStore(await open_database(settings, max_size=2), owner=new_worker_id(), lease_seconds=LEASE)
    other = RunStore(await open_database(settings, max_size=2), owner=new_worker_id(), lease_seconds=LEASE)
    job = RunJob(
        run_id=str(uuid.uuid4()), conversation_id=str(uuid.uuid4()), kind=JobKind.RUN,
        message="paused mid-write", enqueued_at=time.time(),
    )
    try:
        assert await paused.start_run(job) is None
        written, go_on = asyncio.Event(), asyncio.Event()

        async def renew_then_pause() -> None:
            async with paused.db.transaction() as tx:
                await tx.execute("UPDATE runs SET lease_expires = lease_expires WHERE id = ?", (job.run_id,))
                written.set()
                await go_on.wait()  # paused: its commit comes after the takeover

        async def lapsed() -> bool:
            return any(r.id == job.run_id for r in await other.lapsed_runs())

        pause = asyncio.create_task(renew_then_pause())
        await asyncio.wait_for(written.wait(), timeout=10)
        await wait_for_async(lapsed, timeout=LEASE * 3, message="the lease lapsing")
        assert await asyncio.wait_for(other.take_over(job.run_id), timeout=LEASE * 3)
        go_on.set()
        with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):  # the server ended it
            await pause
        rows = await other.db.fetchall("SELECT lease_owner FROM runs WHERE id = ?", (job.run_id,))
        assert rows == [(other.owner,)]
    finally:
        await paused.close()
        await other.close()


def test_a_worker_starting_leaves_a_live_workers_runs_alone(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    hang = Hang(text="still here ")
    model.script_for("live", hang)
    live = start_worker(sophos_env)
    api = start_api(sophos_env)
    conversation, run = chat(api.url, "live run")
    hang.wait_started(20)
    newcomer = start_worker(sophos_env)
    newcomer.wait_for_log('"recovered_runs": 0')
    # Longer than a lease: the live worker renews it; nobody takes the run over.
    deadline = time.monotonic() + LEASE * 2
    while time.monotonic() < deadline:
        assert run_record(api.url, run)["status"] == "running"
        time.sleep(0.2)
    hang.release()
    events = read_sse(api.url, conversation)
    assert events[-1].event == "end" and events.text == "still here "
    assert run in started_runs(live) and run not in started_runs(newcomer)


async def test_a_worker_dying_just_after_it_takes_a_waiting_runs_turn_leaves_the_conversation_free_soon(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama, redis: Redis
) -> None:
    """A run accepted behind another (``enqueue``) claims the conversation when a worker takes its
    turn (worker/run/turns.py). The worker dies right after that claim, before anything else: the
    claim named its taker, so a live worker's sweep frees the conversation within seconds and the
    run ends ``failed``. Before: the taker was recorded only later, so nothing told the sweep whose
    the claim was, and arq's in-progress marker kept the conversation refusing messages for a day.

    The dying worker is this test: the worker's own :func:`take_turn` on the same database and
    Redis, under a worker id that has no heartbeat, and then nothing more."""
    start_worker(sophos_env)
    start_api(sophos_env)
    url = sophos_env.api_url
    model.script(Text("hello"), Text("free again"))
    conversation, _ = chat(url, "hi")
    assert read_sse(url, conversation)[-1].data["status"] == "completed"

    # The waiting run's job, taken by the dying worker's arq (its in-progress marker, a day long).
    job = RunJob(
        run_id=str(uuid.uuid4()), conversation_id=conversation, kind=JobKind.RUN, message="behind",
        enqueued_at=time.time(), may_wait=True,
    )
    await redis.rpush(waiting_key(conversation), job.run_id)
    await redis.set(arq_in_progress_key(job.run_id), "1", px=86_400_000)
    settings = Settings.from_env(sophos_env)
    store = RunStore(await open_database(settings, max_size=2), owner=new_worker_id())
    try:
        async with open_checkpointer(settings, size=1) as saver:
            service = RunService(settings, redis, store, reader_graph(saver))
            assert await take_turn(redis, store, service.graph, service.ending, job) is not None
    finally:
        await store.close()
    assert await redis.hget(ACTIVE_RUNS, conversation) == job.run_id  # type: ignore[misc]

    async def accepted() -> bool:
        return (await post_chat_async(url, "again", conversation)).status_code == 202

    await wait_for_async(accepted, timeout=20, message="the conversation taking a message again")
    run = get_json(url, f"/api/runs/{job.run_id}")
    assert run["status"] == "failed" and run["error"]["code"] == "INTERRUPTED", run
    assert read_sse(url, conversation)[-1].data["status"] == "completed"


def test_counting_the_conversations_waiting_reads_no_conversation_it_does_not_count(
    sophos_env: SophosEnv,
) -> None:
    """A /metrics scrape counts the conversations waiting for a decision. On a store that grew
    since PostgreSQL last gathered statistics (a bulk load, figure 24's 100,000 conversations), a
    join let the planner hash every conversation for it; the count's subquery reads one row per
    waiting run whatever the statistics say. The tables are the columns the count reads (in a
    schema of the test's own: the application's indexes would make the load slow), freshly loaded,
    never analyzed."""
    with psycopg.connect(sophos_env["DATABASE_URL"], autocommit=True) as conn:
        conn.execute("CREATE SCHEMA grown")
        conn.execute("SET search_path TO grown")
        conn.execute("CREATE TABLE conversations (id TEXT PRIMARY KEY, last_run_id TEXT)")
        conn.execute("CREATE TABLE runs (id TEXT PRIMARY KEY, conversation_id TEXT, status TEXT)")
        conn.execute("CREATE INDEX runs_by_status ON runs(status)")
        conn.execute(
            "INSERT INTO conversations SELECT 'c' || g, 'r' || g || '-4' FROM generate_series(1, 100000) g"
        )
        conn.execute(
            "INSERT INTO runs SELECT 'r' || g || '-' || k, 'c' || g,"
            " CASE WHEN g % 1000 = 0 AND k = 4 THEN 'waiting' ELSE 'completed' END"
            " FROM generate_series(1, 100000) g, generate_series(0, 4) k"
        )
        sql = WAITING_COUNT_SQL.replace("?", "%s")
        plan = "\n".join(r[0] for r in conn.execute(f"EXPLAIN {sql}", ("waiting",)).fetchall())
        count = conn.execute(sql, ("waiting",)).fetchone()
    assert "Seq Scan on conversations" not in plan, plan
    assert count == (100,)
