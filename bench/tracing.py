"""Figure 15: what tracing costs. The same runs with traces exported over OTLP and without.

Two stacks of their own (Redis, fake model, worker, API), alike but for one thing: the
traced one has ``OTEL_EXPORTER_OTLP_ENDPOINT`` naming a loopback OTLP/HTTP receiver in the
benchmark process (tests/support/otlp.py, decoding what it is sent as a collector would), the
other has no OpenTelemetry variable. The runs of both (figure 1's workload: a tool call and a
20-token answer, one run at a time) are shuffled into one random order per round, so the
machine's drift falls on both alike. Per run: POST → ``end`` from the client's clock; per
round: the CPU seconds of the worker and the API over that arm's runs (``/proc``), per run.
After the runs the receiver must hold a ``run`` span of every traced run, and nothing from
the other stack: a traced stack that exported nothing fails the benchmark.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack, ExitStack
from dataclasses import dataclass, field

from bench.client import BenchError, chat_once, http_client
from bench.runs import MESSAGE
from bench.stack import Stack, running_stack, start_side_by_side
from bench.stats import Summary, ratio
from tests.support.otlp import OtlpReceiver, Span

ON, OFF = "traced (OTLP to loopback)", "tracing off"
ROLES = ("worker", "API")
HEADING = "## The cost of tracing (figure 15)"
RUN = "run"  # the worker's span of a run


@dataclass(frozen=True, slots=True)
class Sizes:
    warm: int
    rounds: int
    runs: int
    #: the traced processes' ``OTEL_BSP_SCHEDULE_DELAY`` in ms (None: the SDK's 5 s, as deployed)
    export_every_ms: int | None = None


FULL = Sizes(warm=5, rounds=5, runs=30)
#: the smoke run waits for every traced run's spans: batches every 0.2 s instead of every 5 s
QUICK = Sizes(warm=1, rounds=1, runs=3, export_every_ms=200)


@dataclass
class TracingCost:
    rounds: int
    runs_per_round: int
    quick: bool = False
    #: POST → ``end`` of every run, ms
    total_ms: dict[str, list[float]] = field(default_factory=lambda: {ON: [], OFF: []})
    #: CPU ms per run of each round, by arm and role
    cpu_ms: dict[str, dict[str, list[float]]] = field(
        default_factory=lambda: {arm: {role: [] for role in ROLES} for arm in (ON, OFF)}
    )
    spans: int = 0
    spans_per_run: float = 0.0
    exports: int = 0
    elapsed_s: float = 0.0
    command: str = ""
    date: str = ""
    code: str = ""
    load: str = ""

    def cpu(self, arm: str, role: str | None = None) -> list[float]:
        """CPU ms per run of ``role`` (None: worker + API), each round."""
        roles = ROLES if role is None else (role,)
        return [sum(self.cpu_ms[arm][r][i] for r in roles) for i in range(len(self.cpu_ms[arm][ROLES[0]]))]


def _cpu(stack: Stack) -> dict[str, float]:
    snapshot = stack.cpu_snapshot()
    return {role: snapshot.get(role, 0.0) for role in ROLES}


async def _measure(
    stacks: dict[str, Stack], sizes: Sizes, rng: random.Random, result: TracingCost
) -> set[str]:
    traced_runs: set[str] = set()
    async with AsyncExitStack() as exits:
        clients = {
            arm: await exits.enter_async_context(http_client(stack.api_url)) for arm, stack in stacks.items()
        }
        for arm in stacks:
            for _ in range(sizes.warm):
                await chat_once(clients[arm], MESSAGE)
        for _ in range(sizes.rounds):
            order = [ON, OFF] * sizes.runs
            rng.shuffle(order)
            spent = {arm: dict.fromkeys(ROLES, 0.0) for arm in stacks}
            for arm in order:
                before = _cpu(stacks[arm])
                run = await chat_once(clients[arm], MESSAGE)
                after = _cpu(stacks[arm])
                for role in ROLES:
                    spent[arm][role] += after[role] - before[role]
                result.total_ms[arm].append(run.total_ms)
                if arm == ON:
                    traced_runs.add(run.run)
            for arm in stacks:
                for role in ROLES:
                    result.cpu_ms[arm][role].append(1000 * spent[arm][role] / sizes.runs)
    return traced_runs


def measure(
    *,
    quick: bool,
    rng: random.Random,
    overrides: Mapping[str, str] | None = None,
    keep: bool = False,
    say: Callable[[str], None] = lambda _: None,
) -> TracingCost:
    """Figure 15 on two stacks of its own; raises :class:`BenchError` when tracing exported nothing."""
    started = time.monotonic()
    sizes = QUICK if quick else FULL
    result = TracingCost(rounds=sizes.rounds, runs_per_round=sizes.runs, quick=quick)
    say(f"figure 15: {sizes.rounds} round(s) of {sizes.runs} runs traced and {sizes.runs} not")
    with OtlpReceiver() as otlp, ExitStack() as exits:
        traced = {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url}
        if sizes.export_every_ms is not None:
            traced["OTEL_BSP_SCHEDULE_DELAY"] = str(sizes.export_every_ms)
        stacks = {
            arm: exits.enter_context(running_stack(overrides={**(overrides or {}), **env}, keep=keep))
            for arm, env in ((ON, traced), (OFF, {}))
        }
        start_side_by_side(*stacks.values())
        traced_runs = asyncio.run(_measure(stacks, sizes, rng, result))
        # Each process's batch processor exports every OTEL_BSP_SCHEDULE_DELAY (5 s by default).
        try:
            otlp.wait(lambda spans: traced_runs <= _ended_runs(spans), timeout=30, message="every traced run")
        except TimeoutError as exc:
            raise BenchError(f"figure 15: {exc}") from None
        spans = otlp.snapshot()
        result.exports = otlp.requests
    services = {s.service for s in spans}
    if services != {"sophos-api", "sophos-worker"}:
        raise BenchError(f"figure 15: spans from {services}, expected the traced API and worker only")
    result.spans = len(spans)
    result.spans_per_run = len(spans) / max(1, len(traced_runs) + sizes.warm)
    result.elapsed_s = time.monotonic() - started
    return result


def _ended_runs(spans: list[Span]) -> set[str]:
    """Runs whose spans both processes exported: the API's enqueue and the worker's run (its last)."""
    def of(name: str) -> set[str]:
        return {str(s.attributes.get("sophos.run.id")) for s in spans if s.name == name}

    return of(RUN) & of("enqueue run")


def _fmt(value: float) -> str:
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"


def section(c: TracingCost) -> str:
    """Figure 15, headed: POST → ``end`` and CPU per run, traced and not, side by side."""
    on, off = Summary.of(c.total_ms[ON]), Summary.of(c.total_ms[OFF])
    lines = [
        f"| per run | {ON} | {OFF} | difference | ratio |",
        "|---|---:|---:|---:|---:|",
        f"| POST → `end`, ms, p50 | {_fmt(on.p50)} | {_fmt(off.p50)} | {on.p50 - off.p50:+.2f} "
        f"| {ratio(on.p50, off.p50):.2f}× |",
        f"| POST → `end`, ms, p95 | {_fmt(on.p95)} | {_fmt(off.p95)} | {on.p95 - off.p95:+.2f} "
        f"| {ratio(on.p95, off.p95):.2f}× |",
    ]
    for role, label in (("worker", "worker"), ("API", "API"), (None, "worker + API")):
        a, b = statistics.median(c.cpu(ON, role)), statistics.median(c.cpu(OFF, role))
        lines.append(f"| CPU, ms, {label} | {_fmt(a)} | {_fmt(b)} | {a - b:+.2f} | {ratio(a, b):.2f}× |")
    rounds = "; ".join(
        f"{arm}: " + ", ".join(f"{x:.1f}" for x in c.cpu(arm)) for arm in (ON, OFF)
    )
    return (
        f"{HEADING}\n\n"
        "What exporting traces costs a run: two stacks of their own, alike but for "
        "`OTEL_EXPORTER_OTLP_ENDPOINT` (a loopback OTLP/HTTP receiver in the benchmark process, "
        "the SDK's defaults otherwise: batches every 5 s), figure 1's workload (a tool call and a "
        f"20-token answer), one run at a time, {c.rounds} round(s) of {c.runs_per_round} runs of each, "
        "shuffled into one random order per round. POST → `end` is the client's clock; CPU is the "
        "worker's and the API's (user + system, `/proc`, 10 ms ticks summed over a round's runs of "
        "that arm), median over the rounds. The receiver got "
        f"{c.spans} spans in {c.exports} exports ({c.spans_per_run:.1f} per run), none from the "
        "untraced stack.\n\n"
        f"Measured by `{c.command}` on {c.date} (code {c.code}; load average at start, at end: "
        f"{c.load}){'; quick mode, a smoke run: not a measurement' if c.quick else ''}; this figure took "
        f"{c.elapsed_s:.0f} s.\n\n" + "\n".join(lines)
        + f"\n\nCPU ms per run (worker + API), each round: {rounds}.\n"
    )
