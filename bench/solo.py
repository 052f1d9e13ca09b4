"""Figure 17: what a higher ``WORKER_CONCURRENCY`` costs a run that has the worker to itself
(issue 33, part 3).

Two stacks of their own (Redis, fake model, worker, API), alike but for the worker's
``WORKER_CONCURRENCY`` (1 and 4), started at once and left idle but the one under load. Each
round runs ``runs`` runs one at a time on each stack, the stacks in a fresh random order, so
drift on this shared machine falls on both alike. Per run: POST → ``end`` at the client, the
worker's CPU (``/proc``, summed over the round), and the Redis commands the stack's Redis
served (``INFO commandstats``, by command): the last needs no quiet machine.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis as redis_sync

from bench.client import chat_once, http_client
from bench.profiling import Recorder, render
from bench.runs import MESSAGE
from bench.stack import Stack, cpu_seconds, running_stack, start_side_by_side

CONCURRENCIES = (1, 4)


@dataclass(frozen=True, slots=True)
class Sizes:
    warm: int
    rounds: int
    runs: int


FULL = Sizes(warm=5, rounds=8, runs=25)
QUICK = Sizes(warm=1, rounds=1, runs=3)


@dataclass
class Arm:
    concurrency: int
    #: POST → end of each run, ms
    total_ms: list[float] = field(default_factory=list)
    #: worker CPU ms per run, each round
    cpu_ms: list[float] = field(default_factory=list)
    #: Redis commands per run, by command, summed over the rounds (divide by runs)
    commands: collections.Counter[str] = field(default_factory=collections.Counter)
    runs: int = 0

    @property
    def env(self) -> dict[str, str]:
        return {"WORKER_CONCURRENCY": str(self.concurrency)}


@dataclass
class Solo:
    arms: list[Arm]
    rounds: int
    runs_per_round: int
    elapsed_s: float = 0.0
    #: (title, py-spy raw file) per concurrency, with ``--profile``
    profiles: list[tuple[str, Path]] = field(default_factory=list)


def _commands(url: str) -> collections.Counter[str]:
    with contextlib.closing(redis_sync.Redis.from_url(url)) as client:
        stats: Any = client.info("commandstats")  # the sync client: a dict
    return collections.Counter(
        {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()}
    )


async def _round(stack: Stack, arm: Arm, runs: int) -> None:
    assert stack.worker is not None
    before_cmds = _commands(stack.redis.url)
    before_cpu = cpu_seconds(stack.worker.pid)
    async with http_client(stack.api_url) as http:
        for _ in range(runs):
            arm.total_ms.append((await chat_once(http, MESSAGE)).total_ms)
    arm.cpu_ms.append((cpu_seconds(stack.worker.pid) - before_cpu) * 1000 / runs)
    after = _commands(stack.redis.url)
    after.subtract(before_cmds)
    after["info"] -= 1  # the look at the counts itself
    arm.commands.update(+after)
    arm.runs += runs


def measure(
    *,
    quick: bool,
    rng: random.Random,
    overrides: Mapping[str, str] | None = None,
    keep: bool = False,
    profile: Path | None = None,
    say: Callable[[str], None] = lambda _: None,
) -> Solo:
    """Figure 17: a stack per concurrency, one run at a time on each, round-robin."""
    sizes = QUICK if quick else FULL
    started = time.monotonic()
    arms = [Arm(n) for n in CONCURRENCIES]
    base = dict(overrides or {})
    with contextlib.ExitStack() as stacks:
        running = [
            stacks.enter_context(running_stack(overrides={**base, **arm.env}, keep=keep)) for arm in arms
        ]
        start_side_by_side(*running)

        async def rounds() -> None:
            for stack in running:
                async with http_client(stack.api_url) as http:
                    for _ in range(sizes.warm):
                        await chat_once(http, MESSAGE)
            for i in range(sizes.rounds):
                order = list(zip(running, arms, strict=True))
                rng.shuffle(order)
                for stack, arm in order:
                    await _round(stack, arm, sizes.runs)
                say(f"figure 17: round {i + 1}/{sizes.rounds} done")
            if profile is not None:
                for stack, arm in zip(running, arms, strict=True):
                    profiles.append(await _profiled(stack, arm, sizes.runs * 2, profile))

        profiles: list[tuple[str, Path]] = []
        asyncio.run(rounds())
    elapsed = time.monotonic() - started
    return Solo(arms, sizes.rounds, sizes.runs, elapsed_s=elapsed, profiles=profiles)


async def _profiled(stack: Stack, arm: Arm, runs: int, out: Path) -> tuple[str, Path]:
    """py-spy on the worker while it serves ``runs`` runs one at a time (after the figure's rounds)."""
    assert stack.worker is not None
    recorder = Recorder(stack.worker.pid, out / f"worker-concurrency-{arm.concurrency}.txt")
    await asyncio.sleep(1.0)  # py-spy attached
    async with http_client(stack.api_url) as http:
        for _ in range(runs):
            await chat_once(http, MESSAGE)
    return f"worker, WORKER_CONCURRENCY={arm.concurrency}, {runs} runs one at a time", recorder.stop()


HEADING = "## One run at a time, WORKER_CONCURRENCY 1 and 4 (figure 17)"


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def section(s: Solo, *, command: str = "", code: str = "", date: str = "", load: str = "") -> str:
    """Markdown: per concurrency, POST → end, worker CPU and Redis commands per run."""
    base = s.arms[0]
    lines = [
        "| WORKER_CONCURRENCY | POST → end p50 / p95 ms | ratio p50 | worker ms CPU per run (median round) "
        "| ratio | Redis commands per run |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for arm in s.arms:
        p50, base50 = statistics.median(arm.total_ms), statistics.median(base.total_ms)
        cpu, base_cpu = statistics.median(arm.cpu_ms), statistics.median(base.cpu_ms)
        lines.append(
            f"| {arm.concurrency} | {p50:.1f} / {_pct(arm.total_ms, 0.95):.1f} | {p50 / base50:.2f}× "
            f"| {cpu:.1f} | {cpu / base_cpu:.2f}× | {sum(arm.commands.values()) / max(arm.runs, 1):.1f} |"
        )
    names = sorted({n for arm in s.arms for n in arm.commands}, key=lambda n: -base.commands[n])
    per_command = [
        "| command | " + " | ".join(f"per run at {arm.concurrency}" for arm in s.arms) + " |",
        "|---|" + "---:|" * len(s.arms),
    ]
    for name in names:
        cells = [f"{arm.commands[name] / max(arm.runs, 1):.2f}" for arm in s.arms]
        per_command.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return (
        f"{HEADING}\n\n"
        f"Two stacks alike but for `WORKER_CONCURRENCY`, {s.rounds} round(s) of {s.runs_per_round} runs "
        "one at a time on each, the stacks in a random order each round; CPU from `/proc` (10 ms ticks) "
        "summed over a round; Redis commands from the stack's own Redis (`INFO commandstats`), which do not "
        f"depend on the machine's load (it was shared while measuring). Took {s.elapsed_s:.0f} s.\n\n"
        + (f"Measured by `{command}` on {date} (code {code}; load average at start, at end: {load}).\n\n"
           if command else "")
        + "\n".join(lines) + "\n\nRedis commands per run, by command:\n\n" + "\n".join(per_command) + "\n"
        + "".join("\n" + render(title, path, top=25) for title, path in s.profiles)
    )
