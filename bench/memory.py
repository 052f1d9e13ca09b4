"""Figure 16: where the process tree's memory goes, per process, at rest, after many runs and
with many open streams (issue 33).

One stack of its own (Redis, the fake model, one worker, one API). Each process of the tree
is named by its role: the worker, its MCP server, the API, the API's reader processes
(api/http/readers.py), Redis; the fake model is the benchmark's, not the service's, and is left
out. For each process: RSS (``VmRSS``, what the issue's figures and ``ps`` count: pages a
process shares with another are counted in each) and PSS (``Pss`` of ``smaps_rollup``: a
shared page split between the processes sharing it, so the tree's PSS adds up to the memory
it really holds). Neither depends on the machine's load.

Phases, each a snapshot:

1. **at rest**: both processes ready, no run yet, idle for ``idle_wait`` seconds.
2. **after N runs**: ``clients`` clients share N runs (figure 4's load), then a page's reads
   of the last conversation: its detail and its Markdown export (a transcript read, which is
   what starts a reader process).
3. **readers idle**: ``idle_wait`` seconds later, nothing asked of the API meanwhile.
4. **streams open**: the worker paused (SIGSTOP: it keeps its memory, takes no job), ``streams``
   clients each subscribed to a queued run of its own (figure 6's streams), the probe event
   relayed to all; then the streams end, the runs are taken out of the queue, the worker
   resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import httpx
from redis.asyncio import Redis

from bench.client import BenchError, Client, chat_once, http_client
from bench.runs import MESSAGE
from bench.stack import KIB, Stack, _cmdline, rss_bytes, running_stack
from bench.streams import api_streams
from tests.support.procs import descendant_pids

PHASES = ("at rest", "after the runs", "readers idle", "streams open")


@dataclass(frozen=True, slots=True)
class Sizes:
    runs: int
    clients: int
    streams: int
    #: seconds between the runs' last read and the "readers idle" snapshot
    idle_wait: float
    #: how long a reader may stay idle in this figure's stack (READER_IDLE_SECONDS): shorter than
    #: ``idle_wait``, so the "readers idle" phase sees them stopped; code without that setting ignores it
    reader_idle: float
    #: how long the tree must stay as it is to be taken as settled (:func:`settled`)
    settle: float = 1.0


FULL = Sizes(runs=1000, clients=16, streams=200, idle_wait=8.0, reader_idle=5.0)
#: the smoke run's waits are the same steps, scaled down: each phase is still taken once
QUICK = Sizes(runs=20, clients=8, streams=50, idle_wait=0.6, reader_idle=0.3, settle=0.25)


@dataclass(frozen=True, slots=True)
class Proc:
    role: str
    pid: int
    rss: int
    pss: int


@dataclass
class Memory:
    runs: int
    clients: int
    streams: int
    idle_wait: float
    reader_idle: float = FULL.reader_idle
    #: phase -> the processes of the tree then
    phases: dict[str, list[Proc]] = field(default_factory=dict)
    command: str = ""
    code: str = ""
    date: str = ""
    load: str = ""
    quick: bool = False
    elapsed_s: float = 0.0

    def total(self, phase: str, what: str) -> int:
        return sum(getattr(p, what) for p in self.phases.get(phase, []))


def pss_bytes(pid: int) -> int:
    """Proportional set size of ``pid`` (0 if it is gone or /proc hides it)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * KIB
    except OSError:
        pass
    return 0


def _role(parent: str, pid: int) -> str:
    line = _cmdline(pid)
    if "api.http.reader" in line:  # api.http.reader_process (api.http.readers before)
        return f"{parent}'s reader process"
    if "tools_server" in line or "mcp" in line:
        return f"{parent}'s MCP server"
    if "resource_tracker" in line:
        return f"{parent}'s multiprocessing resource tracker"
    return f"{parent}'s child ({line[:60]})"


def tree(stack: Stack) -> list[Proc]:
    """The service's processes now, each with its RSS and PSS."""
    found: list[tuple[str, int]] = []
    for name, proc in (("worker", stack.worker), ("API", stack.api)):
        if proc is None:
            continue
        found.append((name, proc.pid))
        found.extend((_role(name, child), child) for child in descendant_pids(proc.pid))
    if stack.redis.pid:
        found.append(("Redis", stack.redis.pid))
    procs = []
    for role, pid in found:
        with contextlib.suppress(OSError):
            procs.append(Proc(role, pid, rss_bytes(pid)[0], pss_bytes(pid)))
    return procs


async def settled(stack: Stack, *, still: float, within: float = 30.0) -> list[Proc]:
    """The tree once no process of it has started or grown for ``still`` seconds (a reader process
    still importing, a spare on its way), or as it is after ``within`` seconds."""
    deadline = time.monotonic() + within
    last = tree(stack)
    while time.monotonic() < deadline:
        await asyncio.sleep(still)
        now = tree(stack)
        same = [p.pid for p in now] == [p.pid for p in last]
        if same and all(abs(a.rss - b.rss) < KIB * KIB for a, b in zip(now, last, strict=True)):
            return now
        last = now
    return last


async def _runs(http: Client, runs: int, clients: int) -> str:
    left, last = runs, ""

    async def client() -> None:
        nonlocal left, last
        while left > 0:
            left -= 1
            last = (await chat_once(http, MESSAGE)).conversation

    await asyncio.gather(*(client() for _ in range(clients)))
    return last


async def _page_reads(api_url: str, conversation: str) -> None:
    """What the page asks when a conversation is opened and exported: thread reads."""
    async with httpx.AsyncClient(base_url=api_url, timeout=120, trust_env=False) as http:
        for target in (f"/api/conversations/{conversation}", f"/api/conversations/{conversation}/export"):
            response = await http.get(target)
            if response.status_code != 200:
                raise BenchError(f"GET {target}: {response.status_code} {response.text[:300]}")


async def _phases(stack: Stack, sizes: Sizes, result: Memory, say: Callable[[str], None]) -> None:
    assert stack.worker is not None and stack.api is not None
    await settled(stack, still=sizes.settle)  # started: a reader started with the API, if any, ready
    await asyncio.sleep(sizes.idle_wait)
    result.phases["at rest"] = await settled(stack, still=sizes.settle)
    say(f"figure 16: {sizes.runs} runs, {sizes.clients} clients")
    async with http_client(stack.api_url, connections=sizes.clients + 4) as http:
        last = await _runs(http, sizes.runs, sizes.clients)
    await _page_reads(stack.api_url, last)
    result.phases["after the runs"] = await settled(stack, still=sizes.settle)
    await asyncio.sleep(sizes.idle_wait)
    result.phases["readers idle"] = await settled(stack, still=sizes.settle)
    say(f"figure 16: {sizes.streams} open streams, the worker paused")
    redis = Redis.from_url(stack.redis.url, decode_responses=True)
    snapshot: list[Proc] = []
    os.kill(stack.worker.pid, signal.SIGSTOP)
    try:
        await api_streams(
            stack.api_url, stack.api.pid, redis, sizes.streams, at_open=lambda: snapshot.extend(tree(stack))
        )
    finally:
        os.kill(stack.worker.pid, signal.SIGCONT)
        await redis.aclose()
    result.phases["streams open"] = snapshot


def measure(
    *,
    quick: bool,
    overrides: Mapping[str, str] | None = None,
    keep: bool = False,
    say: Callable[[str], None] = lambda _: None,
) -> Memory:
    """Figure 16 on a stack of its own."""
    sizes = QUICK if quick else FULL
    started = time.monotonic()
    result = Memory(
        runs=sizes.runs, clients=sizes.clients, streams=sizes.streams, idle_wait=sizes.idle_wait,
        reader_idle=sizes.reader_idle, quick=quick,
    )
    env = {"READER_IDLE_SECONDS": f"{sizes.reader_idle:g}", **(overrides or {})}
    with running_stack(overrides=env, keep=keep) as stack:
        stack.start()
        asyncio.run(_phases(stack, sizes, result, say))
    result.elapsed_s = time.monotonic() - started
    return result


HEADING = "## The process tree's memory (figure 16)"


def _mb(value: int) -> str:
    return f"{value / (1024 * KIB):.0f}"


def section(m: Memory) -> str:
    """Markdown: RSS / PSS of each process in each phase, and the tree's totals."""
    roles: list[str] = []
    for phase in PHASES:
        for p in m.phases.get(phase, []):
            if p.role not in roles:
                roles.append(p.role)
    lines = [
        "| process, MB RSS / PSS | " + " | ".join(PHASES) + " |",
        "|---|" + "---:|" * len(PHASES),
    ]
    for role in roles:
        cells = []
        for phase in PHASES:
            mine = [p for p in m.phases.get(phase, []) if p.role == role]
            count = f"{len(mine)} × " if len(mine) > 1 else ""
            cells.append(
                f"{count}{_mb(sum(p.rss for p in mine))} / {_mb(sum(p.pss for p in mine))}" if mine else "—"
            )
        lines.append(f"| {role} | " + " | ".join(cells) + " |")
    lines.append(
        "| **the tree** | "
        + " | ".join(f"**{_mb(m.total(ph, 'rss'))} / {_mb(m.total(ph, 'pss'))}**" for ph in PHASES)
        + " |"
    )
    return (
        f"{HEADING}\n\n"
        "The service's processes, each on its own row (the fake model left out), in four phases of one "
        f"stack: at rest (both ready, no run yet, {m.idle_wait:g} s idle); after the runs ("
        f"{m.runs} runs, {m.clients} clients, then the last conversation's detail and Markdown export, "
        f"the reads that start a reader process); readers idle ({m.idle_wait:g} s later, with "
        f"`READER_IDLE_SECONDS={m.reader_idle:g}`); streams open ({m.streams} SSE streams on queued "
        "runs, the worker paused with SIGSTOP so that it keeps its memory and takes none of them). RSS "
        "counts a page shared between processes in each of them (what `ps` shows and issue 33's figures "
        "add up); PSS splits it between them, so the tree's PSS is the memory it holds. Neither depends "
        "on the machine's load (the machine was shared while measuring).\n\n"
        f"Measured by `{m.command}` on {m.date} (code {m.code}; load average at start, at end: {m.load})"
        f"{'; quick mode, a smoke run: not a measurement' if m.quick else ''}; this figure took "
        f"{m.elapsed_s:.0f} s.\n\n" + "\n".join(lines) + "\n"
    )
