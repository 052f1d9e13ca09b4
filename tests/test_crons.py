"""Crons (docs/agent-protocol.md, "Crons") driven by the real ``langgraph-sdk`` client against real
APIs and workers with the fake model: a tick fires once across two workers (PostgreSQL), a cron
survives a worker's restart and fires a missed tick once, late, a busy thread's tick is skipped
and said so, a deleted cron stops, search lists them, a bad schedule is 422. Schedules have a
seconds field (``*/2 * * * * *``), so the tests wait seconds for conditions, never minutes."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.errors import NotFoundError, UnprocessableEntityError
from redis.asyncio import Redis

from shared.contracts.crons import CronCreate, CronUpdate, Schedule, tick_run_id, tick_thread_id
from shared.contracts.jobs import JobKind, RunJob
from shared.redis.keys import ACTIVE_RUNS, QUEUE_NAME
from shared.redis.queue import submit_run
from shared.storage import Database
from shared.storage.postgres import PostgresDatabase, migrate
from shared.storage.schema import iso_from_timestamp
from shared.storage.sqlite import SqliteDatabase
from tests.fakes.ollama import FakeOllama, Hang, ToolCalls
from tests.support.agent_protocol import said
from tests.support.client import chat, wait_for_async
from tests.support.env import SophosEnv, require_approval
from tests.support.http import async_http_client
from tests.support.ports import free_port
from tests.support.procs import ServiceProcess
from worker.schedule.crons.jobs import create, update
from worker.schedule.crons.ticker import LONGEST_SLEEP_SECONDS, CronTicker
from worker.schedule.crons.ticks import UNSUBMITTED_SECONDS

EVERY_2S = "*/2 * * * * *"
SKIPPED_METRIC = 'sophos_cron_ticks_total{outcome="skipped"}'

StartService = Callable[..., ServiceProcess]


def as_cron(made: Any) -> dict[str, Any]:
    """A created cron: the SDK types it as a ``Run``, the server answers a ``Cron``."""
    return dict(made)


def tick_of(run: dict[str, Any]) -> float:
    return datetime.fromisoformat(run["metadata"]["cron_tick"]).timestamp()


async def cron_runs(client: LangGraphClient, thread_id: str) -> list[dict[str, Any]]:
    runs = await client.runs.list(thread_id, limit=100)
    return [dict(r) for r in runs if (r["metadata"] or {}).get("cron_id")]


async def one_cron(client: LangGraphClient, cron_id: str) -> dict[str, Any]:
    found = [dict(c) for c in await client.crons.search(limit=100) if c["cron_id"] == cron_id]
    assert len(found) == 1
    return found[0]


async def runs_at_least(client: LangGraphClient, thread_id: str, n: int) -> list[dict[str, Any]]:
    async def enough() -> list[dict[str, Any]] | None:
        runs = await cron_runs(client, thread_id)
        return runs if len(runs) >= n else None

    return await wait_for_async(enough, timeout=30, message=f"{n} runs of the cron on {thread_id}")


async def run_status_of(client: LangGraphClient, thread_id: str, run_id: str, status: str) -> bool:
    return (await client.runs.get(thread_id, run_id))["status"] == status


def fired_lines(*workers: ServiceProcess) -> list[dict[str, Any]]:
    return [r for w in workers for r in w.log_records() if r.get("event") == "cron.tick_fired"]


@pytest.mark.parametrize("backend", ["postgresql"])
async def test_a_cron_on_a_thread_fires_once_per_tick_across_two_workers_and_stops_when_deleted(
    sophos_env: SophosEnv, start_worker: StartService, start_api: StartService, model: FakeOllama
) -> None:
    workers = [start_worker(sophos_env), start_worker(sophos_env)]
    api = start_api(sophos_env)
    async with get_client(url=api.url) as client:
        thread = await client.threads.create()
        cron = as_cron(await client.crons.create_for_thread(
            thread["thread_id"], "agent", schedule=EVERY_2S, input=said("tick"), metadata={"kind": "test"},
        ))
        assert cron["thread_id"] == thread["thread_id"] and cron["schedule"] == EVERY_2S
        runs = await runs_at_least(client, thread["thread_id"], 4)

        ticks = [tick_of(r) for r in runs]
        assert len(set(ticks)) == len(ticks), "one run per tick"
        assert all(t % 2 == 0 for t in ticks)
        assert all(r["metadata"]["kind"] == "test" for r in runs)
        assert all(r["metadata"]["cron_id"] == cron["cron_id"] for r in runs)
        # Every tick was fired by one worker only, and each fired tick is one run.
        fired = fired_lines(*workers)
        fired_ticks = [line["tick"] for line in fired]
        assert len(fired_ticks) == len(set(fired_ticks))
        await wait_for_async(
            lambda: {r["run_id"] for r in runs} <= {line["run_id"] for line in fired_lines(*workers)},
            timeout=10, message="each run's tick logged as fired",
        )

        async def counted_as_logged() -> dict[str, Any] | None:
            # Read between two ticks (each is logged just after its commit): the same count.
            stored = await one_cron(client, cron["cron_id"])
            return stored if stored["fired"] == len(fired_lines(*workers)) else None

        stored = await wait_for_async(counted_as_logged, timeout=10, message="fired ticks counted once")
        assert stored["skipped"] == 0

        await client.crons.delete(cron["cron_id"])
        assert [c for c in await client.crons.search() if c["cron_id"] == cron["cron_id"]] == []
        deleted_at = len(await cron_runs(client, thread["thread_id"]))
        # A witness on another thread with the same schedule: once it has fired twice after the
        # delete, the deleted cron had two ticks in which to fire, and fired in none.
        witness_thread = await client.threads.create()
        witness = as_cron(await client.crons.create_for_thread(
            witness_thread["thread_id"], "agent", schedule=EVERY_2S, input=said("witness"),
        ))
        await runs_at_least(client, witness_thread["thread_id"], 2)
        after = await cron_runs(client, thread["thread_id"])
        # The delete waited for the worker's commit, which waits for a tick being fired to commit.
        assert len(after) == deleted_at
        await client.crons.delete(witness["cron_id"])
    assert all(w.alive for w in workers)


async def test_a_cron_survives_a_worker_killed_mid_run_and_fires_a_missed_tick_once_late(
    sophos_env: SophosEnv, start_worker: StartService, start_api: StartService, model: FakeOllama
) -> None:
    hang = Hang(text="thinking ")
    model.script_for("still there?", hang)  # the first tick's run; the later ones answer at once
    worker = start_worker(sophos_env)
    api = start_api(sophos_env)
    async with get_client(url=api.url) as client:
        thread = await client.threads.create()
        cron = as_cron(await client.crons.create_for_thread(
            thread["thread_id"], "agent", schedule=EVERY_2S, input=said("still there?"),
        ))
        await hang.wait_started_async(30)
        worker.kill()
        assert worker.wait(10) == -signal.SIGKILL
        stopped_at = time.time()
        # Down long enough for several ticks to be missed (a condition: the clock has passed them).
        await wait_for_async(lambda: time.time() > stopped_at + 5, timeout=10, message="ticks missed")
        restarted_at = time.time()
        again = start_worker(sophos_env)
        # The cut run is interrupted and the thread resumable: the next ticks' messages run on it.
        runs = await runs_at_least(client, thread["thread_id"], 3)
        first = min(runs, key=tick_of)
        assert first["status"] == "interrupted" and tick_of(first) < stopped_at

        after = [r for r in runs if r["run_id"] != first["run_id"]]
        missed = [r for r in after if tick_of(r) < restarted_at]
        assert len(missed) == 1, "the ticks missed while no worker ran fire once, late"
        late = [line for line in again.log_records() if line.get("event") == "cron.tick_fired"]
        assert late[0]["late_seconds"] > 1
        await wait_for_async(
            lambda: run_status_of(client, thread["thread_id"], missed[0]["run_id"], "success"),
            timeout=30, message="the late tick's run completed",
        )
        assert (await one_cron(client, cron["cron_id"]))["fired"] >= len(runs)


async def test_a_tick_on_a_busy_thread_is_skipped_and_said_so(
    sophos_env: SophosEnv, start_worker: StartService, start_api: StartService, model: FakeOllama
) -> None:
    # Two jobs at once: the cron's creation is a job, and the run holding the thread holds one.
    env = sophos_env.with_(WORKER_CONCURRENCY="2")
    worker = start_worker(env)
    api = start_api(env)
    hang = Hang(text="busy ")
    model.script_for("hold the thread", hang)
    async with get_client(url=api.url) as client:
        thread_id, holder = chat(api.url or "", "hold the thread")
        await hang.wait_started_async(20)
        cron = as_cron(
            await client.crons.create_for_thread(thread_id, "agent", schedule=EVERY_2S, input=said("tick"))
        )

        async def skipped_twice() -> dict[str, Any] | None:
            stored = await one_cron(client, cron["cron_id"])
            return stored if stored["skipped"] >= 2 else None

        stored = await wait_for_async(skipped_twice, timeout=30, message="two ticks skipped")
        assert stored["fired"] == 0
        assert stored["last_tick"]["outcome"] == f"skipped: the thread is busy with run {holder}"
        assert stored["last_tick"]["run_id"] is None
        # Never queued: the thread's only run is the one holding it.
        assert [r["run_id"] for r in await client.runs.list(thread_id)] == [holder]
        assert worker.wait_for_log(lambda line: "cron.tick_skipped" in line and holder in line)
        async with async_http_client() as http:
            metrics = (await http.get(f"{api.url}/metrics")).text
        counted = [line for line in metrics.splitlines() if line.startswith(SKIPPED_METRIC)]
        assert len(counted) == 1 and float(counted[0].split()[-1]) >= 2

        # Once the thread is free, the next tick runs on it.
        hang.release()
        await runs_at_least(client, thread_id, 1)
        await client.crons.delete(cron["cron_id"])


async def test_a_cron_without_a_thread_runs_each_tick_on_a_new_thread_and_search_lists_crons(
    sophos_env: SophosEnv, start_worker: StartService, start_api: StartService, model: FakeOllama
) -> None:
    start_worker(sophos_env)
    api = start_api(sophos_env)
    async with get_client(url=api.url) as client:
        thread = await client.threads.create()
        daily = as_cron(await client.crons.create_for_thread(
            thread["thread_id"], "agent", schedule="0 9 * * *", input=said("good morning"),
            metadata={"kind": "daily"},
        ))
        assert daily["next_run_date"].endswith("T09:00:00+00:00")
        cron = as_cron(
            await client.crons.create(
                "agent", schedule=EVERY_2S, input=said("new thread each time"), on_run_completed="keep"
            )
        )
        assert cron["thread_id"] is None

        async def two_fired() -> dict[str, Any] | None:
            stored = await one_cron(client, cron["cron_id"])
            return stored if stored["fired"] >= 2 else None

        await wait_for_async(two_fired, timeout=30, message="two ticks fired")
        threads = await client.threads.search(limit=100)
        made = [t for t in threads if t["thread_id"] != thread["thread_id"]]
        assert len(made) >= 2, "a new thread per tick"
        for made_thread in made[:2]:
            runs = await cron_runs(client, made_thread["thread_id"])
            assert [r["metadata"]["cron_id"] for r in runs] == [cron["cron_id"]]

        listed = await client.crons.search()
        assert {c["cron_id"] for c in listed} == {daily["cron_id"], cron["cron_id"]}
        assert [c["cron_id"] for c in await client.crons.search(thread_id=thread["thread_id"])] == [
            daily["cron_id"]
        ]
        assert len(await client.crons.search(limit=1)) == 1
        oldest_first = await client.crons.search(sort_by="created_at", sort_order="asc")
        assert [c["cron_id"] for c in oldest_first] == [daily["cron_id"], cron["cron_id"]]
        assert await client.crons.search(assistant_id="other") == []
        by_metadata = await client.crons.search(metadata={"kind": "daily"})
        assert [c["cron_id"] for c in by_metadata] == [daily["cron_id"]]
        soonest_first = await client.crons.search(sort_by="next_run_date", sort_order="asc")
        assert [c["cron_id"] for c in soonest_first] == [cron["cron_id"], daily["cron_id"]]
        await client.crons.delete(cron["cron_id"])
        assert [c["cron_id"] for c in await client.crons.search()] == [daily["cron_id"]]

        # A thread's crons are deleted with it.
        await client.runs.wait(thread["thread_id"], "agent", input=said("a conversation now"))
        await client.threads.delete(thread["thread_id"])

        async def none_left() -> bool:
            return await client.crons.search() == []

        await wait_for_async(none_left, timeout=10, message="the thread's cron deleted with it")


async def test_a_cron_created_disabled_never_fires_until_updated_and_updates_change_what_it_runs(
    sophos_env: SophosEnv, start_worker: StartService, start_api: StartService, model: FakeOllama
) -> None:
    start_worker(sophos_env)
    api = start_api(sophos_env)
    async with get_client(url=api.url) as client:
        # A witness: an enabled cron, whose ticks say time passed for the disabled one too.
        # It keeps its threads: one deleted between the search and its runs' listing below was a 404.
        witness = as_cron(await client.crons.create(
            "agent", schedule=EVERY_2S, input=said("witness"), on_run_completed="keep",
        ))
        assert witness["enabled"] is True
        cron = as_cron(await client.crons.create(
            "agent", schedule="0 9 * * *", input=said("before"), metadata={"v": 1}, enabled=False,
            on_run_completed="keep",  # its runs are read from its threads below
        ))
        assert cron["enabled"] is False and cron["next_run_date"] is None

        async def witness_fired(at_least: int) -> int:
            async def enough() -> dict[str, Any] | None:
                stored = await one_cron(client, witness["cron_id"])
                return stored if stored["fired"] >= at_least else None

            found = await wait_for_async(enough, timeout=30, message=f"the witness fired {at_least} ticks")
            return int(found["fired"])

        await witness_fired(2)
        assert (await one_cron(client, cron["cron_id"]))["fired"] == 0, "a disabled cron never fires"
        assert [c["cron_id"] for c in await client.crons.search(enabled=False)] == [cron["cron_id"]]
        assert [c["cron_id"] for c in await client.crons.search(enabled=True)] == [witness["cron_id"]]

        # Enabled, on a new schedule, with a new message and metadata.
        updated: dict[str, Any] = dict(await client.crons.update(
            cron["cron_id"], schedule=EVERY_2S, enabled=True, input=said("after"), metadata={"v": 2},
        ))
        assert updated["enabled"] is True and updated["schedule"] == EVERY_2S
        assert updated["payload"]["input"] == said("after") and updated["metadata"] == {"v": 2}
        assert updated["next_run_date"] is not None

        async def fired_once() -> dict[str, Any] | None:
            stored = await one_cron(client, cron["cron_id"])
            return stored if stored["fired"] >= 1 and stored["last_tick"]["outcome"] == "fired" else None

        fired = await wait_for_async(fired_once, timeout=30, message="the enabled cron fired")
        async def its_runs() -> list[dict[str, Any]] | None:
            # A tick's thread is listed once a worker starts its run (it may queue behind the witness's).
            threads = await client.threads.search(limit=100)
            return [r for t in threads for r in await cron_runs(client, t["thread_id"])
                    if r["metadata"]["cron_id"] == cron["cron_id"]] or None

        runs = await wait_for_async(its_runs, timeout=30, message="the enabled cron's run listed")
        assert all(r["metadata"]["v"] == 2 for r in runs)

        # Disabled again: no tick fires while the witness's do.
        disabled: dict[str, Any] = dict(await client.crons.update(cron["cron_id"], enabled=False))
        assert disabled["enabled"] is False and disabled["next_run_date"] is None
        assert disabled["schedule"] == EVERY_2S and disabled["metadata"] == {"v": 2}

        async def settled() -> dict[str, Any] | None:
            # Stored disabled (a busy worker takes the job later than the answer), no tick in flight.
            stored = await one_cron(client, cron["cron_id"])
            return None if stored["enabled"] or stored["last_tick"]["outcome"] == "submitting" else stored

        recorded = await wait_for_async(settled, timeout=30, message="stored disabled, tick recorded")
        count = int(recorded["fired"])
        assert count >= fired["fired"]
        await witness_fired(int((await one_cron(client, witness["cron_id"]))["fired"]) + 2)
        assert (await one_cron(client, cron["cron_id"]))["fired"] == count, "a disabled cron never fires"

        # Refused by name, and an unknown cron is 404.
        with pytest.raises(UnprocessableEntityError) as refused:
            await client.crons.update(cron["cron_id"], webhook="http://example.test/")
        assert "webhook is not served" in refused.value.response.json()["detail"]
        with pytest.raises(UnprocessableEntityError) as refused:
            await client.crons.update(cron["cron_id"], schedule="61 * * * *")
        assert "61 is out of the minute field's range" in refused.value.response.json()["detail"]
        with pytest.raises(NotFoundError):
            await client.crons.update("00000000-0000-4000-8000-000000000000", enabled=True)
        assert (await one_cron(client, cron["cron_id"]))["enabled"] is False


async def test_refusals_name_the_problem_and_change_nothing(
    sophos_env: SophosEnv, start_worker: StartService, start_api: StartService, model: FakeOllama
) -> None:
    start_worker(sophos_env)
    api = start_api(sophos_env)
    async with get_client(url=api.url) as client:
        thread = await client.threads.create()
        cases: list[tuple[dict[str, Any], str]] = [
            ({"schedule": "61 * * * *"}, "61 is out of the minute field's range 0-59"),
            ({"schedule": "every minute"}, "has 2 fields"),
            ({"schedule": "0 0 31 2 *"}, "never fires"),
            ({"schedule": EVERY_2S, "input": None}, "input must be one user message"),
            ({"schedule": EVERY_2S, "webhook": "http://example.test/"}, "webhook is not served"),
            ({"schedule": EVERY_2S, "timezone": "Europe/Nowhere"}, "'Europe/Nowhere' is not a time zone"),
            ({"schedule": EVERY_2S, "multitask_strategy": "enqueue"}, "multitask_strategy 'enqueue'"),
        ]
        for options, named in cases:
            kwargs = {"input": said("x"), **options}
            with pytest.raises(UnprocessableEntityError) as refused:
                as_cron(await client.crons.create_for_thread(thread["thread_id"], "agent", **kwargs))
            body = refused.value.response.json()
            assert named in body["error"]["message"] and body["error"]["code"] == "BAD_REQUEST", body
        threadless: list[tuple[dict[str, Any], str]] = [
            ({"on_run_completed": "later"}, "on_run_completed must be 'delete' or 'keep'"),
            ({"stream_mode": "updates"}, "stream_mode other than values"),
        ]
        for options, named in threadless:
            with pytest.raises(UnprocessableEntityError) as refused:
                as_cron(await client.crons.create("agent", schedule=EVERY_2S, input=said("x"), **options))
            assert named in refused.value.response.json()["detail"]
        with pytest.raises(NotFoundError):
            as_cron(await client.crons.create("other", schedule=EVERY_2S, input=said("x")))
        with pytest.raises(NotFoundError):
            as_cron(await client.crons.create_for_thread(
                "00000000-0000-4000-8000-000000000000", "agent", schedule=EVERY_2S, input=said("x")
            ))
        with pytest.raises(NotFoundError) as unknown:
            await client.crons.delete("00000000-0000-4000-8000-000000000000")
        detail = unknown.value.response.json()["detail"]
        assert detail == "cron 00000000-0000-4000-8000-000000000000 not found"
        with pytest.raises(UnprocessableEntityError):
            await client.crons.delete("not-a-uuid")
        assert await client.crons.search() == []
        info = await client.http.get("/info")
        assert info["flags"]["crons"] is True


async def test_two_workers_racing_for_the_same_ticks_fire_each_once(postgres_url: str, redis: Redis) -> None:
    """The conditional update, without processes around it: two tickers (two workers' pools) look
    at the same due ticks at the same instant, twenty times; each tick is fired by one of them."""
    await migrate(postgres_url)
    dbs = [await PostgresDatabase.open(postgres_url), await PostgresDatabase.open(postgres_url)]
    try:
        tickers = [CronTicker(db, redis) for db in dbs]
        now = time.time()
        for i in range(20):
            cron_id = str(uuid.uuid4())
            async with dbs[0].transaction() as tx:
                await tx.execute(
                    "INSERT INTO crons (id, thread_id, schedule, message, metadata, created_at, updated_at,"
                    " next_tick) VALUES (?, NULL, ?, 'hi', '{}', 'now', 'now', ?)",
                    (cron_id, EVERY_2S, int(now) - 1 - i),
                )
            fired = await asyncio.gather(*(t.once(now) for t in tickers))
            assert sorted(fired) == [0, 1], f"tick {i}: {fired}"
            rows = await dbs[1].fetchall(
                "SELECT fired, skipped, last_run_id FROM crons WHERE id = ?", (cron_id,)
            )
            assert rows[0][:2] == (1, 0)
            assert await redis.zscore(QUEUE_NAME, rows[0][2]) is not None  # its run is queued, once
        assert await redis.zcard(QUEUE_NAME) == 20
        assert await redis.hlen(ACTIVE_RUNS) == 20  # type: ignore[misc]
    finally:
        for db in dbs:
            await db.close()


async def test_a_tick_on_a_thread_waiting_for_a_decision_or_gone_is_skipped(
    sophos_env: SophosEnv, start_worker: StartService, start_api: StartService, model: FakeOllama
) -> None:
    require_approval(sophos_env, ["add"])
    start_worker(sophos_env)
    api = start_api(sophos_env)
    model.script_for("add them", ToolCalls([("tools__add", {"a": 2, "b": 3})]))
    async with get_client(url=api.url) as client:
        waiting = await client.threads.create()
        await client.runs.wait(waiting["thread_id"], "agent", input=said("add them"))
        assert (await client.threads.get(waiting["thread_id"]))["status"] == "interrupted"
        gone = await client.threads.create()
        on_waiting = as_cron(await client.crons.create_for_thread(
            waiting["thread_id"], "agent", schedule=EVERY_2S, input=said("tick"),
        ))
        on_gone = as_cron(await client.crons.create_for_thread(
            gone["thread_id"], "agent", schedule=EVERY_2S, input=said("x")
        ))
        await client.threads.delete(gone["thread_id"])  # created empty: no conversation, its crons stay

        async def skipped(cron_id: str) -> dict[str, Any] | None:
            stored = await one_cron(client, cron_id)
            return stored if stored["skipped"] >= 1 else None

        stored = await wait_for_async(lambda: skipped(on_waiting["cron_id"]), timeout=30, message="skipped")
        assert stored is not None
        assert stored["last_tick"]["outcome"] == "skipped: the thread waits for a decision"
        stored = await wait_for_async(lambda: skipped(on_gone["cron_id"]), timeout=30, message="skipped")
        assert stored is not None
        assert stored["last_tick"]["outcome"] == "skipped: the thread is gone"
        assert stored["fired"] == 0
        assert len(await client.runs.list(waiting["thread_id"])) == 1  # still waiting, nothing queued


async def test_a_cron_created_while_no_worker_runs_is_stored_once_one_is_back(
    sophos_env: SophosEnv, start_worker: StartService, start_api: StartService, model: FakeOllama
) -> None:
    api = start_api(sophos_env)
    async with get_client(url=api.url) as client, async_http_client(base_url=api.url or "") as http:
        thread = await client.threads.create()
        cron = as_cron(await client.crons.create_for_thread(
            thread["thread_id"], "agent", schedule="0 9 * * *", input=said("later"),
        ))
        assert cron["next_run_date"].endswith("T09:00:00+00:00") and cron["fired"] == 0
        assert await client.crons.search() == []  # the job waits for a worker
        worker = start_worker(sophos_env)

        async def listed() -> list[Any] | None:
            return await client.crons.search() or None

        found = await wait_for_async(listed, timeout=30, message="the cron stored by the worker")
        assert [c["cron_id"] for c in found] == [cron["cron_id"]]
        assert found[0]["next_run_date"] == cron["next_run_date"]

        # A delete while no worker runs is accepted (202), and done once one is back.
        assert worker.stop() == 0
        assert (await http.delete(f"/runs/crons/{cron['cron_id']}")).status_code == 202
        assert len(await client.crons.search()) == 1
        start_worker(sophos_env)

        async def none_left() -> bool:
            return await client.crons.search() == []

        await wait_for_async(none_left, timeout=30, message="the cron deleted by the worker")


async def due_cron(db: Database, now: float) -> tuple[str, int]:
    """A cron without a thread whose tick is due at ``now``: its id and that tick."""
    cron_id, tick = str(uuid.uuid4()), int(now) - 1
    async with db.transaction() as tx:
        await tx.execute(
            "INSERT INTO crons (id, thread_id, schedule, message, metadata, created_at, updated_at,"
            " next_tick) VALUES (?, NULL, ?, 'hi', '{}', 'now', 'now', ?)",
            (cron_id, EVERY_2S, tick),
        )
    return cron_id, tick


async def test_a_tick_whose_submission_failed_is_fired_again_as_the_same_run(
    tmp_path: Path, redis: Redis
) -> None:
    """Redis down at the tick: nothing is committed, the tick stays due; the next pass fires it.
    A tick whose run was submitted by an attempt that did not commit counts as fired, once."""
    db = await SqliteDatabase.open(tmp_path / "sophos.db")
    unreachable = Redis.from_url(f"redis://127.0.0.1:{free_port()}", socket_connect_timeout=1)
    try:
        now = time.time()
        cron_id, tick = await due_cron(db, now)
        assert await CronTicker(db, unreachable).once(now) == 0
        rows = await db.fetchall("SELECT next_tick, fired, skipped FROM crons WHERE id = ?", (cron_id,))
        assert rows == [(tick, 0, 0)]
        assert await CronTicker(db, redis).once(now) == 1
        rows = await db.fetchall("SELECT next_tick > ?, fired, last_run_id FROM crons WHERE id = ?",
                                 (tick, cron_id))
        assert rows == [(1, 1, tick_run_id(cron_id, tick))]

        # An earlier attempt submitted this tick's run, then failed before its commit.
        cron_id, tick = await due_cron(db, now)
        run_id = tick_run_id(cron_id, tick)
        job = RunJob(run_id, tick_thread_id(cron_id, tick), JobKind.RUN, "hi", now, new_conversation=True)
        assert await submit_run(redis, job, title="hi") is None
        assert await CronTicker(db, redis).once(now) == 1
        rows = await db.fetchall("SELECT fired, skipped, last_run_id FROM crons WHERE id = ?", (cron_id,))
        assert rows == [(1, 0, run_id)]
        assert await redis.zcard(QUEUE_NAME) == 2  # the first cron's run and this one, once each
    finally:
        await unreachable.aclose()
        await db.close()


async def test_a_cron_enabled_again_fires_none_of_the_ticks_missed_while_disabled(
    tmp_path: Path, redis: Redis
) -> None:
    """The ``cron_update`` job: a cron disabled an hour ago and enabled now fires next at its
    schedule's first tick after now, not the hour's missed ticks; a ticker skips it while disabled."""
    db = await SqliteDatabase.open(tmp_path / "sophos.db")
    try:
        now = time.time()
        cron_id = str(uuid.uuid4())
        made = CronCreate(cron_id, None, EVERY_2S, "hi", {}, now - 3600, str(uuid.uuid4()), enabled=False)
        assert await create(db, redis, made) == "done"
        assert await CronTicker(db, redis).once(now) == 0, "a disabled cron's due tick does not fire"
        assert await CronTicker(db, redis).earliest() is None
        job = CronUpdate(cron_id, str(uuid.uuid4()), now, enabled=True)
        assert await update(db, redis, job) == "done"
        rows = await db.fetchall("SELECT next_tick, enabled, fired FROM crons WHERE id = ?", (cron_id,))
        assert rows == [(Schedule.parse(EVERY_2S).next_after(now), 1, 0)]
        assert await update(db, redis, CronUpdate(str(uuid.uuid4()), str(uuid.uuid4()), now)) == "done"
    finally:
        await db.close()


async def test_a_cron_stored_by_any_worker_wakes_every_ticker_at_once(tmp_path: Path, redis: Redis) -> None:
    """With no cron, a ticker sleeps its longest between passes. The create job, whichever worker
    runs it (here: one without a ticker), wakes every ticker through Redis at once: the cron's
    first tick fires on time, not once their sleep is over."""
    db = await SqliteDatabase.open(tmp_path / "sophos.db")
    tickers = [CronTicker(db, redis), CronTicker(db, redis)]
    for ticker in tickers:
        ticker.start()
    try:
        # The first pass and the one its subscription starts have found no cron: asleep.
        await wait_for_async(lambda: all(t.passes >= 2 for t in tickers), timeout=10,
                             message="each ticker's first passes")
        asleep = [t.passes for t in tickers]
        created = time.time()
        job = CronCreate(str(uuid.uuid4()), None, EVERY_2S, "hi", {}, created, str(uuid.uuid4()))
        assert await create(db, redis, job) == "done"
        await wait_for_async(lambda: all(t.passes > n for t, n in zip(tickers, asleep, strict=True)),
                             timeout=10, message="every ticker woken")

        async def fired() -> bool:
            rows = await db.fetchall("SELECT fired, last_tick FROM crons WHERE id = ?", (job.cron_id,))
            return rows[0][0] == 1

        await wait_for_async(fired, timeout=LONGEST_SLEEP_SECONDS / 4, message="the first tick fired")
        rows = await db.fetchall("SELECT last_tick FROM crons WHERE id = ?", (job.cron_id,))
        assert rows == [(Schedule.parse(EVERY_2S).next_after(created),)]
    finally:
        for ticker in tickers:
            await ticker.stop()
        await db.close()


async def test_a_redis_stalled_at_a_tick_leaves_the_database_writable(
    tmp_path: Path, start_redis: Callable[..., Any]
) -> None:
    """A Redis that stops answering (SIGSTOP) while a tick is fired: the tick waits for it, but
    holds no transaction meanwhile, so another writer (a run's checkpoints, the ledger) commits.
    Before: the tick's transaction was open across its Redis round trips, and every other write
    failed with "database is locked" for as long as Redis stalled."""
    server = start_redis(appendonly=False)
    path = tmp_path / "sophos.db"
    db = await SqliteDatabase.open(path)
    stalled = Redis.from_url(server.url)
    # Observed, not faked: the real client, which says when the tick first asks Redis for anything.
    talking = asyncio.Event()
    get_connection = stalled.connection_pool.get_connection

    async def observed(*args: Any, **kwargs: Any) -> Any:
        talking.set()
        return await get_connection(*args, **kwargs)

    stalled.connection_pool.get_connection = observed

    def another_write() -> None:
        conn = sqlite3.connect(path, timeout=2)
        try:
            with conn:
                conn.execute("INSERT INTO crons (id, thread_id, schedule, message, metadata, created_at,"
                             " updated_at, next_tick) VALUES ('other', NULL, ?, 'hi', '{}', 'now', 'now', ?)",
                             (EVERY_2S, int(time.time()) + 3600))
        finally:
            conn.close()

    try:
        now = time.time()
        cron_id, tick = await due_cron(db, now)
        assert server.pid is not None
        os.kill(server.pid, signal.SIGSTOP)
        try:
            firing = asyncio.create_task(CronTicker(db, stalled).once(now))
            await asyncio.wait_for(talking.wait(), 10)
            await asyncio.to_thread(another_write)  # "database is locked" within 2 s, before
            assert not firing.done()
        finally:
            os.kill(server.pid, signal.SIGCONT)
        assert await firing == 1
        rows = await db.fetchall("SELECT fired, last_run_id FROM crons WHERE id = ?", (cron_id,))
        assert rows == [(1, tick_run_id(cron_id, tick))]
        assert await stalled.zscore(QUEUE_NAME, tick_run_id(cron_id, tick)) is not None
    finally:
        await stalled.aclose()
        await db.close()


async def test_a_tick_claimed_by_a_worker_that_died_before_submitting_it_is_submitted_once(
    tmp_path: Path, redis: Redis
) -> None:
    """A tick is claimed (moved on, committed) before its run is submitted: a worker that dies in
    between leaves it ``submitting``, and a pass submits it UNSUBMITTED_SECONDS later, as the same
    run, recorded once; the cron's next tick fires after it."""
    db = await SqliteDatabase.open(tmp_path / "sophos.db")
    try:
        now = time.time()
        cron_id, tick = await due_cron(db, now)
        # What the dead worker committed: the tick claimed, the next one not yet due.
        claimed_at = iso_from_timestamp(now - UNSUBMITTED_SECONDS - 5)
        async with db.transaction() as tx:
            await tx.execute(
                "UPDATE crons SET next_tick = ?, last_tick = ?, last_outcome = 'submitting', last_run_id = ?,"
                " updated_at = ? WHERE id = ?",
                (tick + 2, tick, tick_run_id(cron_id, tick), claimed_at, cron_id),
            )
        ticker = CronTicker(db, redis)
        assert await ticker.once(now - 1) == 1  # the next tick not due yet: the claimed one only
        assert await ticker.once(now - 1) == 0
        rows = await db.fetchall(
            "SELECT next_tick, fired, last_tick, last_outcome, last_run_id FROM crons WHERE id = ?",
            (cron_id,),
        )
        assert rows == [(tick + 2, 1, tick, "fired", tick_run_id(cron_id, tick))]
        assert await redis.zrange(QUEUE_NAME, 0, -1) == [tick_run_id(cron_id, tick)]
        assert await ticker.once(tick + 2) == 1
        assert await redis.zcard(QUEUE_NAME) == 2
    finally:
        await db.close()
