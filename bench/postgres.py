"""Figure 13: PostgreSQL. One run against SQLite, and runs/s with 1, 2, 4, 8 workers (the smoke run: 1, 2).

13: POST → ``end`` of one run at a time on PostgreSQL against SQLite, side by side: two
stacks (each with Redis, the fake model answering at once, one worker and one API), the
runs alternating between them in a random order, so both see the same machine.
Target: PostgreSQL within 1.5 times SQLite at p50.

13b-e: runs/s through W workers (``WORKER_CONCURRENCY=1`` each) on one PostgreSQL
database, the fake model waiting ``MODEL_LATENCY`` before each reply as in figure 11;
2W clients share the runs, each on a new conversation. Target: at least 0.8 times W times
the rate of one worker.

PostgreSQL is the machine's (``SOPHOS_TEST_POSTGRES``, as in the tests), a new database
for each stack, dropped at the end; without a server the figure is left out, saying why.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from bench.client import BenchError, chat_once, http_client
from bench.runs import MESSAGE
from bench.scaling import MODEL_LATENCY, share_runs
from bench.stack import Stack, running_stack, start_side_by_side
from tests.support.postgres import PostgresServer
from tests.support.procs import ServiceProcess, wait_worker_ready

FULL_WORKERS = (1, 2, 4, 8)
QUICK_WORKERS = (1, 2)


@dataclass
class Workers:
    """W workers on one database: ``runs`` runs shared by ``clients`` clients."""

    workers: int
    clients: int
    runs: int
    seconds: float = 0.0
    latency_ms: list[float] = field(default_factory=list)

    @property
    def runs_per_second(self) -> float:
        return self.runs / self.seconds if self.seconds else float("nan")


@dataclass
class Postgres:
    model_latency: float
    #: POST → end of one run at a time, each side's runs (the same count, interleaved)
    single_ms: dict[str, list[float]] = field(default_factory=dict)
    levels: list[Workers] = field(default_factory=list)
    #: why the figure is missing (no PostgreSQL), or ""
    skipped: str = ""
    elapsed_s: float = 0.0

    @property
    def one_worker_rate(self) -> float:
        base = [x for x in self.levels if x.workers == 1]
        return base[0].runs_per_second if base else float("nan")


def runs_for(workers: int, quick: bool) -> int:
    return 2 * workers if quick else max(24, 16 * workers)


async def _single(
    sides: dict[str, Stack], n: int, rng: random.Random, warm: int
) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {name: [] for name in sides}
    async with http_client(sides["sqlite"].api_url) as lite, http_client(sides["postgresql"].api_url) as pg:
        clients = {"sqlite": lite, "postgresql": pg}
        for name in sides:  # warm-up: the first run of each pays for imports and connections
            for _ in range(warm):
                await chat_once(clients[name], MESSAGE)
        order = [name for name in sides for _ in range(n)]
        rng.shuffle(order)
        for name in order:
            out[name].append((await chat_once(clients[name], MESSAGE)).total_ms)
    return out


def _start_workers(stack: Stack, n: int) -> list[ServiceProcess]:
    """``n`` workers started at once, then waited for."""
    env = stack.env.with_(WORKER_CONCURRENCY="1")
    workers = [stack.procs.start_worker(env, wait_ready=False) for _ in range(n)]
    for worker in workers:
        wait_worker_ready(worker, stack.redis.url)
    return workers


def _stop(workers: list[ServiceProcess]) -> None:
    """SIGTERM to every worker at once (each drains and exits by itself), then wait for each."""
    for worker in workers:
        worker.terminate()
    for worker in workers:
        try:
            worker.wait(30)
        except TimeoutError:
            worker.kill_group()


async def _level(stack: Stack, n: int, quick: bool) -> Workers:
    level = Workers(workers=n, clients=2 * n, runs=runs_for(n, quick))
    workers = await asyncio.to_thread(_start_workers, stack, n)
    limit = 30 + 4 * MODEL_LATENCY * level.runs
    try:
        async with http_client(stack.api_url) as http, asyncio.timeout(limit):
            await share_runs(http, n, n, [])  # warm-up
            ran: list[tuple[str, float]] = []
            started = time.perf_counter()
            await share_runs(http, level.runs, level.clients, ran)
            level.seconds = time.perf_counter() - started
    except TimeoutError:
        raise BenchError(f"figure 13: {n} workers: {level.runs} runs not done within {limit:.0f} s") from None
    finally:
        await asyncio.to_thread(_stop, workers)
    level.latency_ms = [ms for _, ms in ran]
    return level


def on_postgres(
    *,
    quick: bool,
    rng: random.Random,
    single: int,
    overrides: Mapping[str, str] | None = None,
    keep: bool = False,
    say: Callable[[str], None] = lambda _: None,
) -> Postgres:
    """Figure 13; raises :class:`BenchError` when a run fails."""
    started = time.monotonic()
    result = Postgres(model_latency=MODEL_LATENCY)
    server = PostgresServer()
    why = server.unreachable()
    if why is not None:
        result.skipped = why
        say(f"figure 13 left out: {why}")
        return result
    try:
        say(f"figure 13: one run at a time, PostgreSQL against SQLite, {single} runs each")
        base = dict(overrides or {})
        with running_stack(overrides=base, keep=keep) as lite, running_stack(
            overrides={**base, "DATABASE_URL": server.create_database()}, keep=keep
        ) as pg:
            sides = {"sqlite": lite, "postgresql": pg}
            start_side_by_side(*sides.values())
            result.single_ms = asyncio.run(_single(sides, single, rng, warm=1 if quick else 3))
        levels = QUICK_WORKERS if quick else FULL_WORKERS
        shared = {**base, "DATABASE_URL": server.create_database()}
        with running_stack(overrides=shared, keep=keep, model_latency=MODEL_LATENCY) as stack:
            stack.start_api()
            for n in levels:
                say(f"figure 13: {n} workers on PostgreSQL, {runs_for(n, quick)} runs, {2 * n} clients")
                result.levels.append(asyncio.run(_level(stack, n, quick)))
    finally:
        server.drop_all()
    result.elapsed_s = time.monotonic() - started
    return result
