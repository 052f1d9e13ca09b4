"""Figures measured with whole runs: 1 (POST → end), 2 (enqueue → start), 4 (throughput),
5 (message 100 vs 1) and 7 (database bytes per message).

Each service measurement is interleaved with its floor (the in-process graph), in
a random order per pair, so drift on this shared machine hits both alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import sqlite3
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from bench.client import Client, ServiceRun, chat_once
from bench.floor import Floor, FloorRun
from shared.redis.keys import run_key

MESSAGE = "Echo the word durable with the tool, then answer."


@dataclass
class Pairs:
    service: list[ServiceRun] = field(default_factory=list)
    floor: list[FloorRun] = field(default_factory=list)
    #: CPU seconds per process role over the service runs, and over the floor runs
    service_cpu: dict[str, float] = field(default_factory=dict)
    floor_cpu: dict[str, float] = field(default_factory=dict)


async def _pair(
    rng: random.Random, service: Any, floor: Any, pairs: Pairs, cpu: Callable[[], dict[str, float]]
) -> None:
    """Run one service and one floor measurement, in a random order."""

    async def one_service() -> None:
        before = cpu()
        pairs.service.append(await service())
        _add_cpu(pairs.service_cpu, before, cpu())

    async def one_floor() -> None:
        before = cpu()
        pairs.floor.append(await floor())
        _add_cpu(pairs.floor_cpu, before, cpu())

    if rng.random() < 0.5:
        await one_service()
        await one_floor()
    else:
        await one_floor()
        await one_service()


async def warm_up(http: Client, floor: Floor, n: int) -> None:
    for _ in range(n):
        await chat_once(http, MESSAGE)
        await floor.run(str(uuid.uuid4()), MESSAGE)


async def single_runs(
    http: Client, floor: Floor, n: int, rng: random.Random, cpu: Callable[[], dict[str, float]] = dict
) -> Pairs:
    """Figure 1: a new conversation per run, one run at a time."""
    pairs = Pairs()
    for _ in range(n):
        await _pair(
            rng,
            lambda: chat_once(http, MESSAGE),
            lambda: floor.run(str(uuid.uuid4()), MESSAGE),
            pairs,
            cpu,
        )
    return pairs


@dataclass
class Throughput:
    clients: int
    runs_per_round: int
    service_rps: list[float] = field(default_factory=list)
    floor_rps: list[float] = field(default_factory=list)
    #: POST → end of every run under load
    service_latency_ms: list[float] = field(default_factory=list)
    #: run ids of the service's runs, for the worker's log
    service_runs: list[str] = field(default_factory=list)
    #: CPU seconds per process role, summed over the rounds
    service_cpu: dict[str, float] = field(default_factory=dict)
    floor_cpu: dict[str, float] = field(default_factory=dict)


def _add_cpu(total: dict[str, float], before: dict[str, float], after: dict[str, float]) -> None:
    for role, value in after.items():
        total[role] = total.get(role, 0.0) + value - before.get(role, 0.0)


async def throughput(
    http: Client,
    floor: Floor,
    *,
    rounds: int,
    runs: int,
    clients: int,
    rng: random.Random,
    cpu: Callable[[], dict[str, float]] = dict,
) -> Throughput:
    """Figure 4: ``clients`` concurrent clients, each on new conversations, vs the floor run sequentially."""
    result = Throughput(clients=clients, runs_per_round=runs)

    async def service_round() -> None:
        left = runs
        latencies: list[float] = []

        async def client() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                run = await chat_once(http, MESSAGE)
                latencies.append(run.total_ms)
                result.service_runs.append(run.run)

        before = cpu()
        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        result.service_rps.append(runs / (time.perf_counter() - started))
        _add_cpu(result.service_cpu, before, cpu())
        result.service_latency_ms.extend(latencies)

    async def floor_round() -> None:
        before = cpu()
        started = time.perf_counter()
        for _ in range(runs):
            await floor.run(str(uuid.uuid4()), MESSAGE)
        result.floor_rps.append(runs / (time.perf_counter() - started))
        _add_cpu(result.floor_cpu, before, cpu())

    for _ in range(rounds):
        order = [service_round, floor_round]
        rng.shuffle(order)
        for step in order:
            await step()
    return result


async def long_conversation(http: Client, floor: Floor, n: int, rng: random.Random) -> tuple[Pairs, str, str]:
    """Figure 5: the same exchange ``n`` times on one conversation (and on one floor thread)."""
    pairs = Pairs()
    conversation: str | None = None
    thread = str(uuid.uuid4())

    async def service() -> ServiceRun:
        nonlocal conversation
        run = await chat_once(http, MESSAGE, conversation)
        conversation = run.conversation
        return run

    for _ in range(n):
        await _pair(rng, service, lambda: floor.run(thread, MESSAGE), pairs, dict)
    assert conversation is not None
    return pairs, conversation, thread


# --- figure 2 and the breakdown of figure 1, from the worker's log and the database ---------


def _parse_ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True, slots=True)
class RunTimeline:
    """One service run on the wall clock (all processes share it), in ms."""

    run: str
    #: client sends POST → the API stamps ``enqueued_at`` (HTTP, validation, look-ups)
    accept_ms: float
    #: ``enqueued_at`` → the worker's ``started_at`` in the ``runs`` table (ms resolution)
    wait_sqlite_ms: float
    #: ``enqueued_at`` → the worker logs ``run.started`` (after the run row is committed)
    wait_logged_ms: float
    #: ``run.started`` → ``run.finished`` (graph, final state read, outcome committed)
    work_ms: float
    #: ``run.finished`` → the client has parsed ``end`` (release, publish, relay, SSE)
    deliver_ms: float


async def timelines(
    redis: Redis, database: Path, records: list[dict[str, Any]], runs: list[ServiceRun]
) -> list[RunTimeline]:
    started: dict[str, float] = {}
    finished: dict[str, float] = {}
    for record in records:
        if record.get("event") == "run.started":
            started[record["run_id"]] = _parse_ts(record["timestamp"])
        elif record.get("event") == "run.finished":
            finished[record["run_id"]] = _parse_ts(record["timestamp"])
    async with redis.pipeline(transaction=False) as pipe:
        for run in runs:
            pipe.hget(run_key(run.run), "enqueued_at")
        enqueued_raw = await pipe.execute()
    with sqlite3.connect(f"{database.as_uri()}?mode=ro", uri=True) as db:
        rows = {
            r[0]: (r[1], r[2])
            for r in db.execute("SELECT id, enqueued_at, started_at FROM runs WHERE enqueued_at IS NOT NULL")
        }
    out = []
    for run, enqueued in zip(runs, enqueued_raw, strict=True):
        if enqueued is None or run.run not in started or run.run not in finished or run.run not in rows:
            continue
        enq = float(enqueued)
        row_enqueued, row_started = rows[run.run]
        out.append(
            RunTimeline(
                run=run.run,
                accept_ms=(enq - run.sent_at) * 1000,
                wait_sqlite_ms=(_parse_ts(row_started) - _parse_ts(row_enqueued)) * 1000,
                wait_logged_ms=(started[run.run] - enq) * 1000,
                work_ms=(finished[run.run] - started[run.run]) * 1000,
                deliver_ms=(run.ended_at - finished[run.run]) * 1000,
            )
        )
    return out


# --- figure 7 -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DbSize:
    file_bytes: int
    #: stored checkpoint and write payloads of one thread (no page or index overhead)
    thread_payload_bytes: int


def checkpointed_size(database: Path, thread_id: str | None = None) -> DbSize:
    """Bytes of the database file plus its WAL, after a WAL checkpoint.

    A checkpoint moves what the WAL holds into the main file; it is not a logical
    write, and the worker's own connection would do the same at 1000 pages.
    """
    with sqlite3.connect(database, timeout=10) as db:
        db.execute("PRAGMA busy_timeout=10000")
        try:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        except sqlite3.OperationalError:
            db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        payload = 0
        if thread_id is not None:
            (cp,) = db.execute(
                "SELECT COALESCE(SUM(LENGTH(checkpoint) + LENGTH(metadata)), 0) FROM checkpoints"
                " WHERE thread_id = ?",
                (thread_id,),
            ).fetchone()
            (wr,) = db.execute(
                "SELECT COALESCE(SUM(LENGTH(value)), 0) FROM writes WHERE thread_id = ?", (thread_id,)
            ).fetchone()
            payload = int(cp) + int(wr)
    total = 0
    for suffix in ("", "-wal"):
        with contextlib.suppress(FileNotFoundError):
            total += os.path.getsize(f"{database}{suffix}")
    return DbSize(total, payload)


def stored_messages(database: Path, conversation: str) -> int:
    with sqlite3.connect(f"{database.as_uri()}?mode=ro", uri=True) as db:
        row = db.execute("SELECT message_count FROM conversations WHERE id = ?", (conversation,)).fetchone()
    return int(row[0]) if row else 0


def database_totals(database: Path) -> tuple[int, int, int]:
    """(file bytes incl. WAL after a checkpoint, conversations, stored messages) of the whole file."""
    size = checkpointed_size(database).file_bytes
    with sqlite3.connect(f"{database.as_uri()}?mode=ro", uri=True) as db:
        conversations, messages = db.execute(
            "SELECT COUNT(*), COALESCE(SUM(message_count), 0) FROM conversations"
        ).fetchone()
    return size, int(conversations), int(messages)


@dataclass(frozen=True, slots=True)
class WorkerCycle:
    """The worker's own clock under load (figure 4), from its ``run.started`` / ``run.finished`` lines."""

    #: run.started → run.finished of each run
    work_ms: list[float]
    #: run.finished of a run → run.started of the next (notify, arq hand-off and pick-up, run row)
    gap_ms: list[float]


def worker_cycle(records: list[dict[str, Any]], runs: list[str]) -> WorkerCycle:
    wanted = set(runs)
    started: dict[str, float] = {}
    finished: dict[str, float] = {}
    for record in records:
        run = record.get("run_id")
        if run not in wanted:
            continue
        if record.get("event") == "run.started":
            started[run] = _parse_ts(record["timestamp"])
        elif record.get("event") == "run.finished":
            finished[run] = _parse_ts(record["timestamp"])
    order = sorted((t, r) for r, t in started.items() if r in finished)
    work = [(finished[r] - t) * 1000 for t, r in order]
    # Consecutive runs of one round only: the queue was never empty in between.
    gaps = [
        (t_next - finished[r]) * 1000
        for (_, r), (t_next, _) in itertools.pairwise(order)
        if 0 <= t_next - finished[r] < 1.0
    ]
    return WorkerCycle(work, gaps)
