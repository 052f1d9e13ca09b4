"""Figure 12: the speed switches (EVENT_LOOP, REDIS_PARSER, JSON_CODEC, API_HTTP), each on and off.

Every variant is a stack of its own (Redis, fake model, worker, API), all started
at once and left idle but the one under load: rounds go round-robin over the
variants, in a fresh random order each round, so drift on this shared machine
falls on all alike. A round is figure 4's load: ``clients`` clients share
``runs`` runs, each POSTs a new conversation and reads its stream to ``end``.
Each variant's worker and API say at start-up what they run on (``worker.ready``,
``api.started``); a variant whose processes do not run on what it names fails
the benchmark.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from bench.client import BenchError, chat_once, http_client
from bench.runs import MESSAGE
from bench.stack import Stack, running_stack
from tests.support.procs import wait_api_ready, wait_worker_ready

FAST = {"EVENT_LOOP": "uvloop", "REDIS_PARSER": "hiredis", "JSON_CODEC": "msgspec", "API_HTTP": "httptools"}
PLAIN = {"EVENT_LOOP": "asyncio", "REDIS_PARSER": "python", "JSON_CODEC": "json", "API_HTTP": "h11"}
#: name -> the three switches: all fast, each turned off alone, all off
VARIANTS: dict[str, dict[str, str]] = {
    "all fast": FAST,
    **{f"{name}={PLAIN[name]}": {**FAST, name: PLAIN[name]} for name in FAST},
    "all off": PLAIN,
}
_LOGGED = {
    "EVENT_LOOP": "event_loop", "REDIS_PARSER": "redis_parser", "JSON_CODEC": "json_codec",
    "API_HTTP": "http",
}
#: the switches only the API has
_API_ONLY = {"API_HTTP"}
ROLES = ("worker", "API")


@dataclass(frozen=True, slots=True)
class Sizes:
    warm: int
    rounds: int
    runs: int
    #: the variants measured: quick mode only checks the machinery, on the two ends
    names: tuple[str, ...]


FULL = Sizes(warm=8, rounds=8, runs=56, names=tuple(VARIANTS))
QUICK = Sizes(warm=2, rounds=1, runs=8, names=("all fast", "all off"))


@dataclass
class Variant:
    name: str
    env: dict[str, str]
    #: runs/s of each round
    rps: list[float] = field(default_factory=list)
    #: CPU seconds per run of each round, by role
    cpu: dict[str, list[float]] = field(default_factory=lambda: {role: [] for role in ROLES})

    def per_round_cpu_ms(self, role: str | None = None) -> list[float]:
        """CPU ms per run of ``role`` (None: worker + API), each round."""
        roles = ROLES if role is None else (role,)
        return [sum(self.cpu[r][i] for r in roles) * 1000 for i in range(len(self.rps))]

    def cpu_ms(self, role: str | None = None) -> float:
        """Median over the rounds of CPU ms per run of ``role`` (None: worker + API)."""
        per_round = self.per_round_cpu_ms(role)
        return statistics.median(per_round) if per_round else float("nan")


def _paired(mine: list[float], base: list[float]) -> float:
    """Median over the rounds of mine / base in the same round: drift between rounds cancels."""
    ratios = [m / b for m, b in zip(mine, base, strict=True) if b > 0]
    return statistics.median(ratios) if ratios else float("nan")


@dataclass
class Switches:
    clients: int
    runs_per_round: int
    variants: list[Variant]
    elapsed_s: float = 0.0


def _start(stack: Stack) -> None:
    stack.worker = stack.procs.start_worker(stack.env, wait_ready=False)
    stack.api = stack.procs.start_api(stack.env, wait_ready=False)


def _check_running_on(stack: Stack, env: Mapping[str, str]) -> None:
    assert stack.worker is not None and stack.api is not None
    for proc, event in ((stack.worker, "worker.ready"), (stack.api, "api.started")):
        expected = {_LOGGED[k]: v for k, v in env.items() if proc is stack.api or k not in _API_ONLY}
        records = [r for r in proc.log_records() if r.get("event") == event]
        seen = {k: records[-1].get(k) for k in expected} if records else None
        if seen != expected:
            raise BenchError(f"{proc.name} should run on {expected}, its {event} says {seen}")


def _cpu(stack: Stack) -> dict[str, float]:
    snapshot = stack.cpu_snapshot()
    return {role: snapshot.get(role, 0.0) for role in ROLES}


async def _round(stack: Stack, variant: Variant, runs: int, clients: int) -> None:
    async with http_client(stack.api_url, connections=2 * clients + 8) as http:
        left = runs

        async def client() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await chat_once(http, MESSAGE)

        before = _cpu(stack)
        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        variant.rps.append(runs / (time.perf_counter() - started))
        after = _cpu(stack)
    for role in ROLES:
        variant.cpu[role].append((after[role] - before[role]) / runs)


async def _warm(stack: Stack, runs: int) -> None:
    async with http_client(stack.api_url) as http:
        await asyncio.gather(*(chat_once(http, MESSAGE) for _ in range(runs)))


def measure(
    *,
    quick: bool,
    clients: int,
    rng: random.Random,
    overrides: Mapping[str, str] | None = None,
    keep: bool = False,
    say: Callable[[str], None] = lambda _: None,
) -> Switches:
    """Figure 12: start a stack per variant, then load one at a time, round-robin."""
    sizes = QUICK if quick else FULL
    started = time.monotonic()
    variants = [Variant(name, VARIANTS[name]) for name in sizes.names]
    result = Switches(clients=clients, runs_per_round=sizes.runs, variants=variants)
    with contextlib.ExitStack() as stacks:
        running = [
            stacks.enter_context(running_stack(overrides={**(overrides or {}), **v.env}, keep=keep))
            for v in variants
        ]
        for stack in running:
            say(f"figure 12: data in {stack.root}")
            _start(stack)
        for stack, variant in zip(running, variants, strict=True):
            assert stack.worker is not None and stack.api is not None
            wait_worker_ready(stack.worker, stack.redis.url)
            wait_api_ready(stack.api)
            _check_running_on(stack, variant.env)
        say(f"figure 12: {len(variants)} stacks up in {time.monotonic() - started:.1f} s; warming up")

        async def rounds() -> None:
            for stack in running:
                await _warm(stack, sizes.warm)
            for i in range(sizes.rounds):
                order = list(zip(running, variants, strict=True))
                rng.shuffle(order)
                for stack, variant in order:
                    await _round(stack, variant, sizes.runs, clients)
                say(f"figure 12: round {i + 1}/{sizes.rounds} done")

        asyncio.run(rounds())
    result.elapsed_s = time.monotonic() - started
    return result


HEADING = "## 12. Speed switches"


def section(s: Switches) -> str:
    """Markdown: per variant runs/s, CPU per run of worker and API, ratios to all fast."""
    base = s.variants[0]
    lines = [
        "| variant | runs/s | ratio | worker, ms CPU per run | ratio | API, ms CPU per run | ratio "
        "| worker + API | ratio | worker + API, each round |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for v in s.variants:
        cells = [f"{statistics.median(v.rps):.1f}", f"{_paired(v.rps, base.rps):.2f}×"]
        for role in ("worker", "API", None):
            mine, theirs = v.per_round_cpu_ms(role), base.per_round_cpu_ms(role)
            cells += [f"{v.cpu_ms(role):.1f}", f"{_paired(mine, theirs):.2f}×"]
        rounds = ", ".join(f"{x:.1f}" for x in v.per_round_cpu_ms())
        lines.append(f"| {v.name} | {' | '.join(cells)} | {rounds} |")
    return (
        "Each variant a stack of its own, loaded one at a time, round-robin in a random order per round: "
        f"{len(base.rps)} round(s) of {s.runs_per_round} runs, {s.clients} clients (figure 4's load). "
        "Values are medians over the rounds; a ratio is the median over the rounds of variant / all fast "
        "in the same round (a CPU ratio above 1: turning that switch off costs CPU). All fast: "
        "`EVENT_LOOP=uvloop`, `REDIS_PARSER=hiredis`, `JSON_CODEC=msgspec`, `API_HTTP=httptools`. "
        f"Took {s.elapsed_s:.0f} s.\n\n"
        + "\n".join(lines) + "\n"
    )
