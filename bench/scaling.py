"""Figure 11: more runs at once. Runs/s through one worker at ``WORKER_CONCURRENCY`` 1, 2, 4, 8.

The fake model waits ``MODEL_LATENCY`` (200 ms) before each reply, as a real model
takes its time, so a run is mostly waiting on its two model calls; a worker that
runs N of them at once should then finish about N times as many per second.
Target: at least 0.8 times N times the one-run rate (the rate at N = 1) up to N = 8.

A phase of its own, after the other figures: one stack (Redis, the slow fake
model, the API) and, per N, a worker of its own started with
``WORKER_CONCURRENCY=N``, warmed up, given a fixed number of runs and stopped.
2N clients share those runs, each on a new conversation through the real HTTP
API (POST, then the stream to ``end``): N runs running and N queued, so the
worker never waits on a client. runs/s = runs / wall time from the first POST to
the last ``end``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from bench.client import BenchError, Client, chat_once, http_client
from bench.runs import MESSAGE, worker_cycle
from bench.stack import Stack, running_stack

#: seconds the fake model waits before each reply starts (each request in its own thread)
MODEL_LATENCY = 0.2
FULL_LEVELS = (1, 2, 4, 8)
QUICK_LEVELS = (1, 4)


def runs_at(concurrency: int, quick: bool) -> int:
    """Runs measured at one level: enough waves of N runs to swamp the start and the tail."""
    return 2 * concurrency if quick else max(24, 16 * concurrency)


@dataclass
class Level:
    """One ``WORKER_CONCURRENCY``: ``runs`` runs shared by ``clients`` clients."""

    concurrency: int
    clients: int
    runs: int
    seconds: float = 0.0
    #: POST → end of every run (queued time included: N runs wait behind the N running)
    latency_ms: list[float] = field(default_factory=list)
    #: the worker's ``run.started`` → ``run.finished`` of every run
    work_ms: list[float] = field(default_factory=list)
    #: CPU seconds per process role over the runs
    cpu: dict[str, float] = field(default_factory=dict)

    @property
    def runs_per_second(self) -> float:
        return self.runs / self.seconds if self.seconds else float("nan")


@dataclass
class Scaling:
    model_latency: float
    levels: list[Level] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def one_run_rate(self) -> float:
        """runs/s at ``WORKER_CONCURRENCY=1``: the base every other level is held to."""
        base = [x for x in self.levels if x.concurrency == 1]
        return base[0].runs_per_second if base else float("nan")


async def share_runs(http: Client, runs: int, clients: int, ran: list[tuple[str, float]]) -> None:
    """``clients`` clients run ``runs`` runs between them, one new conversation each."""
    left = runs

    async def client() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            run = await chat_once(http, MESSAGE)
            ran.append((run.run, run.total_ms))

    await asyncio.gather(*(client() for _ in range(clients)))


async def _level(stack: Stack, http: Client, concurrency: int, quick: bool) -> Level:
    level = Level(concurrency=concurrency, clients=2 * concurrency, runs=runs_at(concurrency, quick))
    await asyncio.to_thread(stack.start_worker, WORKER_CONCURRENCY=str(concurrency))
    # A generous bound: a wedged run must fail the benchmark, not hang it.
    limit = 30 + 4 * MODEL_LATENCY * level.runs
    try:
        async with asyncio.timeout(limit):
            # Warm-up: N runs at once, so each of the worker's N slots has run once.
            await share_runs(http, concurrency, concurrency, [])
            ran: list[tuple[str, float]] = []
            before = stack.cpu_snapshot()
            started = time.perf_counter()
            await share_runs(http, level.runs, level.clients, ran)
            level.seconds = time.perf_counter() - started
            after = stack.cpu_snapshot()
    except TimeoutError:
        raise BenchError(
            f"figure 11: WORKER_CONCURRENCY={concurrency}: {level.runs} runs not done within {limit:.0f} s"
        ) from None
    finally:
        await asyncio.to_thread(stack.stop_worker)
    level.cpu = {role: after[role] - before.get(role, 0.0) for role in after}
    level.latency_ms = [ms for _, ms in ran]
    level.work_ms = worker_cycle(stack.worker_records(), [run for run, _ in ran]).work_ms
    return level


async def _levels(
    stack: Stack, levels: tuple[int, ...], quick: bool, say: Callable[[str], None]
) -> list[Level]:
    out = []
    async with http_client(stack.api_url) as http:
        for n in levels:
            say(f"figure 11: WORKER_CONCURRENCY={n}, {runs_at(n, quick)} runs, {2 * n} clients")
            out.append(await _level(stack, http, n, quick))
    return out


def more_runs_at_once(
    *,
    quick: bool,
    overrides: Mapping[str, str] | None = None,
    keep: bool = False,
    say: Callable[[str], None] = lambda _: None,
) -> Scaling:
    """Figure 11 on a stack of its own; raises :class:`BenchError` when a run fails."""
    started = time.monotonic()
    result = Scaling(model_latency=MODEL_LATENCY)
    with running_stack(overrides=overrides, keep=keep, model_latency=MODEL_LATENCY) as stack:
        stack.start_api()
        result.levels = asyncio.run(_levels(stack, QUICK_LEVELS if quick else FULL_LEVELS, quick, say))
    result.elapsed_s = time.monotonic() - started
    return result
