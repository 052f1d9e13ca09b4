"""Figure 19: the API under uvicorn (h11, as shipped) and under Granian (Rust, hyper), side by side.

Two stacks (Redis, fake model, worker, API), started at once and loaded one at a time, in a fresh
random order each round, so that drift on this shared machine falls on both alike. A round is a
few runs one at a time (POST → ``end``) and then figure 4's load (``clients`` clients sharing
``runs`` runs), whose runs/s and the API's CPU per run are taken. The API's CPU is its whole
process tree: Granian serves from a worker process of its own.

The Granian arm runs the same app (bench/granian_app.py) with what Granian offers in place of
uvicorn's guarantees: ``--http1-buffer-size`` (8 KiB, the least it takes) bounds a request's
buffer. It has no drain flag (SIGTERM does not end streams first), no ``TCP_USER_TIMEOUT`` on its
socket and no proxy-header handling, so it is measured, not shipped. Granian is not a dependency
of Sophos: ``.venv/bin/python -m pip install -c requirements.lock -e ".[bench]"`` installs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import random
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from api.http.parser import MAX_HEADER_BYTES
from bench.client import BenchError, chat_once, http_client
from bench.runs import MESSAGE
from bench.stack import Stack, _children, cpu_seconds, running_stack
from tests.support.ports import free_port
from tests.support.procs import ServiceProcess, wait_api_ready, wait_worker_ready

HEADING = "## The API's server: uvicorn and Granian (figure 19)"
ARMS = ("uvicorn (h11)", "granian")
REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True, slots=True)
class Sizes:
    warm: int
    rounds: int
    single: int
    runs: int


FULL = Sizes(warm=8, rounds=6, single=10, runs=56)
QUICK = Sizes(warm=2, rounds=1, single=2, runs=8)


@dataclass
class Arm:
    name: str
    #: POST → end, one run at a time (ms)
    latency_ms: list[float] = field(default_factory=list)
    #: runs/s of each loaded round
    rps: list[float] = field(default_factory=list)
    #: the API's CPU (its process tree) per run, ms, each loaded round
    cpu_ms: list[float] = field(default_factory=list)


@dataclass
class Servers:
    clients: int
    sizes: Sizes
    arms: list[Arm]
    elapsed_s: float = 0.0
    granian: str = ""


def available() -> bool:
    """Whether Granian is installed (the ``bench`` extra): figure 19 is measured only then."""
    return importlib.util.find_spec("granian") is not None


def not_measured() -> str:
    """The section of a full run without Granian: said, not left out."""
    return (
        f"{HEADING}\n\nNot measured in this run: Granian is not installed "
        '(`.venv/bin/python -m pip install -c requirements.lock -e ".[bench]"`, then '
        "`python -m bench --only servers`).\n"
    )


def _tree_cpu(pid: int) -> float:
    return cpu_seconds(pid) + sum(_tree_cpu(child) for child in _children(pid))


def _granian(stack: Stack) -> ServiceProcess:
    """The API under Granian, one worker process, on a port of its own."""
    port = free_port()
    env = {**stack.env, "API_PORT": str(port), "PYTHONPATH": str(REPO)}
    args = [
        "--interface", "asgi", "--factory", "--host", "127.0.0.1", "--port", str(port),
        "--workers", "1", "--loop", stack.env.get("EVENT_LOOP", "uvloop").replace("auto", "uvloop"),
        "--http", "1", "--no-ws", "--http1-buffer-size", str(MAX_HEADER_BYTES), "--log-level", "warning",
        "--no-access-log", "bench.granian_app:app",
    ]
    proc = ServiceProcess("api-granian", "granian", env, stack.procs.log_dir / "api-granian.log", args=args)
    proc.url = f"http://127.0.0.1:{port}"
    stack.procs.processes.append(proc)
    return proc


async def _round(stack: Stack, arm: Arm, sizes: Sizes, clients: int) -> None:
    assert stack.api is not None
    async with http_client(stack.api_url, connections=2 * clients + 8) as http:
        for _ in range(sizes.single):
            arm.latency_ms.append((await chat_once(http, MESSAGE)).total_ms)
        left = sizes.runs

        async def client() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await chat_once(http, MESSAGE)

        before = _tree_cpu(stack.api.pid)
        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        arm.rps.append(sizes.runs / (time.perf_counter() - started))
        arm.cpu_ms.append((_tree_cpu(stack.api.pid) - before) * 1000 / sizes.runs)


def measure(
    *,
    quick: bool,
    clients: int,
    rng: random.Random,
    overrides: Mapping[str, str] | None = None,
    keep: bool = False,
    say: Callable[[str], None] = lambda _: None,
) -> Servers:
    """Figure 19: a stack per server, loaded one at a time, round-robin."""
    if not available():
        raise BenchError(
            'figure 19 needs Granian: .venv/bin/python -m pip install -c requirements.lock -e ".[bench]"'
        )
    from importlib.metadata import version

    sizes = QUICK if quick else FULL
    started = time.monotonic()
    arms = [Arm(name) for name in ARMS]
    result = Servers(clients=clients, sizes=sizes, arms=arms, granian=version("granian"))
    with contextlib.ExitStack() as stacks:
        running = [stacks.enter_context(running_stack(overrides=overrides, keep=keep)) for _ in arms]
        for stack, arm in zip(running, arms, strict=True):
            say(f"figure 19: {arm.name}, data in {stack.root}")
            stack.worker = stack.procs.start_worker(stack.env, wait_ready=False)
            stack.api = _granian(stack) if arm.name == "granian" else stack.procs.start_api(
                stack.env, wait_ready=False
            )
        for stack in running:
            assert stack.worker is not None and stack.api is not None
            wait_worker_ready(stack.worker, stack.redis.url)
            wait_api_ready(stack.api)

        async def rounds() -> None:
            for stack in running:
                async with http_client(stack.api_url) as http:
                    await asyncio.gather(*(chat_once(http, MESSAGE) for _ in range(sizes.warm)))
            for i in range(sizes.rounds):
                order = list(zip(running, arms, strict=True))
                rng.shuffle(order)
                for stack, arm in order:
                    await _round(stack, arm, sizes, clients)
                say(f"figure 19: round {i + 1}/{sizes.rounds} done")

        asyncio.run(rounds())
    result.elapsed_s = time.monotonic() - started
    return result


def _ratio(mine: list[float], base: list[float]) -> str:
    return f"{statistics.median(mine) / statistics.median(base):.2f}×"


def section(s: Servers, *, stamp: str = "") -> str:
    """Markdown: per server, POST → end one at a time, runs/s under load, the API's CPU per run."""
    base = s.arms[0]
    lines = [
        "| server | POST → end p50, ms | ratio | runs/s | ratio | API CPU per run, ms | ratio |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for arm in s.arms:
        pairs = ((arm.latency_ms, base.latency_ms), (arm.rps, base.rps), (arm.cpu_ms, base.cpu_ms))
        cells = [f"{statistics.median(mine):.1f} | {_ratio(mine, theirs)}" for mine, theirs in pairs]
        lines.append(f"| {arm.name} | {' | '.join(cells)} |")
    return (
        f"{HEADING}\n\n{stamp}"
        "The same app, worker and load under uvicorn (h11, as shipped) and under Granian "
        f"{s.granian} (bench/granian_app.py; one worker process, HTTP/1, its buffer bounded to 8 KiB), "
        f"each a stack of its own, loaded one at a time in a random order per round: {s.sizes.rounds} "
        f"round(s) of {s.sizes.single} runs one at a time, then {s.sizes.runs} runs from {s.clients} "
        "clients. Medians over the runs (latency) and the rounds (runs/s, CPU); ratios to uvicorn. "
        "Granian lacks uvicorn's drain flag, the socket's TCP_USER_TIMEOUT and proxy headers "
        f"(bench/servers.py): measured, not shipped. Took {s.elapsed_s:.0f} s.\n\n"
        + "\n".join(lines) + "\n"
    )
