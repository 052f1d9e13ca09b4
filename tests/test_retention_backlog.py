"""A retention backlog drains as fast as the worker deletes, and live runs still go between.

Beside live runs the batches are one delete each, and they grow back to ``BATCH`` without them.

Real worker, API, Redis, and SQLite or PostgreSQL. The store is filled first by bench/bigstore.py
(the worker's rows, a thread's checkpoints each), then every conversation is made idle past the
retention in one statement: what turning ``CONVERSATION_RETENTION_DAYS`` on for an old store
finds. The order of what the worker did is read from its log (one process, one file, in order).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import pytest

from bench import bigstore
from shared.storage.schema import iso_from_timestamp
from tests.fakes.ollama import FakeOllama, Hang, Text
from tests.support.client import read_sse, wait_for
from tests.support.env import SophosEnv
from tests.support.procs import ServiceProcess
from tests.test_delete import chat
from worker.upkeep.retention import BATCH, LIVE_BATCH

pytestmark = pytest.mark.backends

#: several batches, the last one short
BACKLOG = 3 * BATCH + BATCH // 2
#: a few batches of one, then the doubling back to BATCH (1 + 2 + 4 + 8 < BATCH * 2), then more
GROWING_BACK = 4 * BATCH + BATCH // 2


def _connect(env: SophosEnv) -> Any:
    url = env.get("DATABASE_URL")
    if url:
        import psycopg

        return psycopg.connect(url, autocommit=True)
    import sqlite3

    return sqlite3.connect(env.database_path, timeout=10, isolation_level=None)


def _fill(env: SophosEnv, conversations: int) -> None:
    url = env.get("DATABASE_URL")
    settings = bigstore.settings_for("postgres" if url else "sqlite", url or str(env.database_path))
    asyncio.run(bigstore.fill(settings, conversations))


def _age_all(env: SophosEnv, days: int, *, but: tuple[str, ...] = ("",)) -> None:
    """Every conversation (``but`` these) idle for ``days``, at once (one statement)."""
    old = iso_from_timestamp(time.time() - days * 86_400)
    m = "%s" if env.get("DATABASE_URL") else "?"
    conn = _connect(env)
    try:
        markers = ", ".join(m for _ in but)
        conn.execute(f"UPDATE conversations SET updated_at = {m} WHERE id NOT IN ({markers})", (old, *but))  # noqa: S608
    finally:
        conn.close()


def _conversations(env: SophosEnv) -> int:
    conn = _connect(env)
    try:
        return int(conn.execute("SELECT count(*) FROM conversations").fetchone()[0])
    finally:
        conn.close()


def _events(worker: ServiceProcess) -> list[dict[str, Any]]:
    return [r for r in worker.log_records() if "event" in r]


def _batches(events: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any], list[str]]]:
    """Each batch the retention queued: its log line's position, the line, its conversations."""
    out, expiring = [], []
    for i, record in enumerate(events):
        if record["event"] == "conversation.expiring":
            expiring.append(record["conversation_id"])
        elif record["event"] == "retention.batch":
            out.append((i, record, expiring))
            expiring = []
    return out


def _batches_logged(worker: ServiceProcess) -> int:
    return sum(r["event"] == "retention.batch" for r in _events(worker))


def _position(events: list[dict[str, Any]], event: str, run_id: str) -> int:
    return next(i for i, r in enumerate(events) if r["event"] == event and r.get("run_id") == run_id)


def _deleted_at(events: list[dict[str, Any]]) -> dict[str, int]:
    return {
        r["conversation_id"]: i for i, r in enumerate(events)
        if r["event"] == "conversation.deleted" and r.get("reason") == "retention"
    }


def test_a_backlog_queues_the_next_batch_when_the_last_ones_deletes_are_done(
    sophos_env: SophosEnv, start_worker
) -> None:
    _fill(sophos_env, BACKLOG)
    worker = start_worker(sophos_env.with_(CONVERSATION_RETENTION_DAYS=1))
    _age_all(sophos_env, 10)
    wait_for(lambda: _conversations(sophos_env) == 0, 120, interval=0.2, message="the backlog deleted")

    events = _events(worker)
    batches = _batches(events)
    deleted = _deleted_at(events)
    assert len(deleted) == BACKLOG
    assert [len(conversations) for _, _, conversations in batches] == [BATCH, BATCH, BATCH, BATCH // 2]
    # One sweep pass started the drain; each later batch was queued by the deletes of the one
    # before it being done, not by a pass: a batch a pass would have taken four passes.
    assert [record["after"] for _, record, _ in batches] == ["pass", "deletes", "deletes", "deletes"]
    for (_, _, before), (position, _, conversations) in itertools.pairwise(batches):
        first_expiring = min(i for i, r in enumerate(events) if r.get("conversation_id") in conversations
                             and r["event"] == "conversation.expiring")
        assert all(deleted[c] < first_expiring for c in before), "a batch queued before the last one was done"
        assert position > first_expiring


def test_a_live_run_waits_behind_one_batch_at_most_not_the_backlog(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    _fill(sophos_env, BACKLOG)
    worker = start_worker(sophos_env.with_(CONVERSATION_RETENTION_DAYS=1))
    api = start_api(sophos_env).url
    # The worker (one job at a time) busy with a run while the first batch is queued, so the
    # live run below is queued behind the whole batch.
    hang = Hang(text="still ", then=Text("going"))
    model.script(hang, Text("live"))
    busy, _ = chat(api, "busy")
    hang.wait_started(20)
    _age_all(sophos_env, 10, but=(busy,))  # a run of it is running: it would be passed over
    wait_for(lambda: sum(r["event"] == "conversation.expiring" for r in _events(worker)) >= BATCH, 30,
             interval=0.1, message="the first batch queued")
    live, live_run = chat(api, "a live one")
    hang.release()
    assert read_sse(api, busy)[-1].data["status"] == "completed"
    assert read_sse(api, live)[-1].data["status"] == "completed"
    wait_for(lambda: _conversations(sophos_env) == 2, 120, interval=0.2, message="the backlog deleted")

    events = _events(worker)
    started = next(
        i for i, r in enumerate(events) if r["event"] == "run.started" and r.get("run_id") == live_run
    )
    deleted = sorted(_deleted_at(events).values())
    assert len(deleted) == BACKLOG
    ahead = sum(i < started for i in deleted)
    # Behind the batch queued before it at most, and the rest of the backlog behind it.
    assert ahead <= BATCH
    assert len(deleted) - ahead >= BACKLOG - BATCH


def test_beside_live_runs_a_batch_is_one_delete_and_without_them_batches_grow_back(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    _fill(sophos_env, GROWING_BACK)
    worker = start_worker(sophos_env.with_(CONVERSATION_RETENTION_DAYS=1))
    api = start_api(sophos_env).url
    # The worker (one job at a time) busy with a hanging run, and two live runs waiting behind it,
    # the first of which hangs in turn: so there are runs waiting when each of the first batches
    # is queued (past the pass's wait for them, since the worker cannot take them yet).
    busy_hang, first_hang = Hang(text="busy ", then=Text("done")), Hang(text="first ", then=Text("done"))
    model.script_for("busy", busy_hang).script_for("first live", first_hang)
    model.script_for("second live", Text("live"))
    busy, busy_run = chat(api, "busy")
    busy_hang.wait_started(20)
    first, first_run = chat(api, "first live")
    second, second_run = chat(api, "second live")
    _age_all(sophos_env, 10, but=(busy, first, second))
    wait_for(lambda: _batches_logged(worker) >= 1, 30, interval=0.1, message="a first batch queued")
    busy_hang.release()
    first_hang.wait_started(30)
    wait_for(lambda: _batches_logged(worker) >= 2, 30, interval=0.1, message="a second batch queued")
    first_hang.release()
    for conversation in (busy, first, second):
        assert read_sse(api, conversation)[-1].data["status"] == "completed"
    wait_for(lambda: _conversations(sophos_env) == 3, 120, interval=0.2, message="the backlog deleted")

    events = _events(worker)
    batches = _batches(events)
    deleted = sorted(_deleted_at(events).values())
    assert len(deleted) == GROWING_BACK
    sizes = [len(conversations) for _, _, conversations in batches]
    # Runs were waiting before the first two batches: one delete each (ten before the adaptation).
    assert [record["runs_first"] > 0 for _, record, _ in batches[:2]] == [True, True]
    assert sizes[:2] == [LIVE_BATCH, LIVE_BATCH]
    # Each live run waited behind that one delete: done after the run before it ended, before it started.
    for before, run in ((busy_run, first_run), (first_run, second_run)):
        ended, started = _position(events, "run.finished", before), _position(events, "run.started", run)
        assert sum(ended < i < started for i in deleted) == LIVE_BATCH
    # Once no run was waiting any more, each batch was twice the one before, up to BATCH (the
    # last one short: what was left).
    live = max(n for n, (_, record, _) in enumerate(batches) if record["runs_first"] > 0)
    assert all(sizes[n] == LIVE_BATCH for n in range(live + 1))
    grown = sizes[live + 1:]
    expected = [min(BATCH, LIVE_BATCH * 2 ** k) for k in range(1, len(grown) + 1)]
    assert grown[:-1] == expected[:-1]
    assert 0 < grown[-1] <= expected[-1]
    assert BATCH in grown
    # The log line says the size it was queued at (the last one's is more than what was left).
    assert [record["size"] for _, record, _ in batches[:-1]] == sizes[:-1]
