"""Figure 23: a remote tool call against a stdio one, per call.

In-process, the worker's own client (``worker.tools.mcp.McpServer``) against the same fake tools
server (tests/fakes/tools_server.py) twice: a stdio child, and a process of its own on loopback
serving Streamable HTTP behind a bearer token (``--http``), the way a remote server is reached
(worker/tools/remote.py: mcp's Streamable HTTP client over httpx). Each call is ``echo`` with the
idempotency key in its ``_meta``, as the ledger sends it; the calls of both arms are shuffled into
one random order, so the machine's drift falls on both alike. Per call: the wall time of
``McpServer.call`` and the CPU time of this process over it (``time.process_time``; the servers
are processes of their own, their CPU not counted). Opening a session is measured once per arm.

Beside them, a task-backed call against a plain one (worker/tools/tasks.py): the task server
(tests/fakes/task_server.py ``--http``) on loopback, its ``long`` tool with ``seconds`` 0 called
plainly and as an MCP task (``tools/call`` with ``task``, then ``tasks/get`` until it is done, then
``tasks/result``), shuffled into the same order.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.client import BenchError
from bench.stats import Summary, ratio
from tests.support.env import FAKES_DIR, TOOLS_SERVER
from tests.support.ports import free_port
from worker.tools.config import load_config
from worker.tools.ledger.attempt import sending
from worker.tools.mcp import McpServer

HEADING = "## A remote tool call against a stdio one (figure 23)"
STDIO, REMOTE = "stdio (a child process)", "Streamable HTTP (loopback)"
TASK, PLAIN = "as an MCP task", "plain"
ARMS = (STDIO, REMOTE, TASK, PLAIN)
TASK_SERVER = FAKES_DIR / "task_server.py"
TOKEN = "bench-token"  # noqa: S105 (the fake server's, on loopback)


@dataclass(frozen=True, slots=True)
class Sizes:
    warm: int
    calls: int


FULL = Sizes(warm=20, calls=500)
QUICK = Sizes(warm=2, calls=10)


@dataclass
class RemoteCost:
    calls: int
    quick: bool = False
    #: wall ms of each call, by arm
    wall_ms: dict[str, list[float]] = field(default_factory=lambda: {arm: [] for arm in ARMS})
    #: CPU ms of this process over each call, by arm
    cpu_ms: dict[str, list[float]] = field(default_factory=lambda: {arm: [] for arm in ARMS})
    #: ms to open and initialize a session and list its tools, by arm
    open_ms: dict[str, float] = field(default_factory=dict)
    elapsed_s: float = 0.0
    command: str = ""
    code: str = ""
    date: str = ""
    #: load average at start; at end
    load: str = ""


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _start_server(port: int, script: Path = TOOLS_SERVER) -> subprocess.Popen[bytes]:
    env = {**os.environ, "TOOLS_TOKEN": TOKEN, "TOOLS_LOG": ""}
    server = subprocess.Popen(
        [sys.executable, str(script), "--http", str(port)], env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while not _listening(port):
        if time.monotonic() > deadline or server.poll() is not None:
            server.kill()
            raise BenchError("the remote tools server did not listen within 20 s")
        time.sleep(0.05)
    return server


#: each arm's call: the tool, its arguments, whether as a task, the answer it must give
CALLS: dict[str, tuple[str, dict[str, Any], bool, str]] = {
    STDIO: ("echo", {"text": "bench"}, False, "bench"),
    REMOTE: ("echo", {"text": "bench"}, False, "bench"),
    TASK: ("long", {"seconds": 0, "text": "bench"}, True, "done: bench"),
    PLAIN: ("long", {"seconds": 0, "text": "bench"}, False, "done: bench"),
}


async def _measure(
    sizes: Sizes, rng: random.Random, work: Path, port: int, task_port: int, cost: RemoteCost,
) -> None:
    path = work / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {
        "local": {"command": sys.executable, "args": [str(TOOLS_SERVER)]},
        "far": {"url": f"http://127.0.0.1:{port}/mcp", "headers": {"Authorization": "Bearer ${TOKEN}"}},
        "tasks": {"url": f"http://127.0.0.1:{task_port}/mcp"},
    }}))
    config = load_config(path, {"TOKEN": TOKEN})
    tasks = McpServer("tasks", config["tasks"], start_timeout=30, call_timeout=30)
    arms = {
        STDIO: McpServer("local", config["local"], start_timeout=30, call_timeout=30),
        REMOTE: McpServer("far", config["far"], start_timeout=30, call_timeout=30),
        TASK: tasks, PLAIN: tasks,
    }
    try:
        for arm, mcp in arms.items():
            if arm == PLAIN:
                continue  # the task server's session, opened once
            started = time.perf_counter()
            if not await mcp.open():
                raise BenchError(f"{arm}: the session did not open: {mcp.error}")
            cost.open_ms[arm] = (time.perf_counter() - started) * 1000
        order = [arm for arm in arms for _ in range(sizes.warm + sizes.calls)]
        rng.shuffle(order)
        seen = dict.fromkeys(arms, 0)
        for n, arm in enumerate(order):
            tool, arguments, task, expected = CALLS[arm]
            with sending(f"bench-{n}"):
                wall, cpu = time.perf_counter(), time.process_time()
                answer = await arms[arm].call(tool, arguments, task=task)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            if answer != expected:
                raise BenchError(f"{arm}: {tool} answered {answer!r}")
            seen[arm] += 1
            if seen[arm] > sizes.warm:
                cost.wall_ms[arm].append(wall * 1000)
                cost.cpu_ms[arm].append(cpu * 1000)
    finally:
        for mcp in {id(m): m for m in arms.values()}.values():
            await mcp.shutdown()


def measure(*, quick: bool, rng: random.Random, say: Callable[[str], None]) -> RemoteCost:
    sizes = QUICK if quick else FULL
    say(f"figure 23: a remote tool call against a stdio one, {sizes.calls} calls of each")
    cost = RemoteCost(calls=sizes.calls, quick=quick)
    began = time.monotonic()
    port, task_port = free_port(), free_port()
    servers = [_start_server(port), _start_server(task_port, TASK_SERVER)]
    try:
        with tempfile.TemporaryDirectory(prefix="sophos-bench-remote-") as work:
            asyncio.run(_measure(sizes, rng, Path(work), port, task_port, cost))
    finally:
        for server in servers:
            server.kill()
            server.wait(10)
    cost.elapsed_s = time.monotonic() - began
    return cost


def _fmt(value: float) -> str:
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"


def section(c: RemoteCost) -> str:
    """Figure 23, headed: per call, wall and CPU, stdio and remote side by side."""
    lines = [f"| per call | {REMOTE} | {STDIO} | difference | ratio |", "|---|---:|---:|---:|---:|"]
    for label, values in (("wall, ms", c.wall_ms), ("CPU of the worker's side, ms", c.cpu_ms)):
        far, near = Summary.of(values[REMOTE]), Summary.of(values[STDIO])
        for name, a, b in (("p50", far.p50, near.p50), ("p95", far.p95, near.p95)):
            lines.append(f"| {label}, {name} | {_fmt(a)} | {_fmt(b)} | {a - b:+.2f} | {ratio(a, b):.2f}× |")
    lines.append(
        f"| opening the session (once), ms | {_fmt(c.open_ms.get(REMOTE, float('nan')))} "
        f"| {_fmt(c.open_ms.get(STDIO, float('nan')))} | | |"
    )
    tasks = [f"| per call, the task server on loopback | {TASK} | {PLAIN} | difference | ratio |",
             "|---|---:|---:|---:|---:|"]
    for label, values in (("wall, ms", c.wall_ms), ("CPU of the worker's side, ms", c.cpu_ms)):
        tasked, plain = Summary.of(values[TASK]), Summary.of(values[PLAIN])
        for name, a, b in (("p50", tasked.p50, plain.p50), ("p95", tasked.p95, plain.p95)):
            tasks.append(f"| {label}, {name} | {_fmt(a)} | {_fmt(b)} | {a - b:+.2f} | {ratio(a, b):.2f}× |")
    return (
        f"{HEADING}\n\n"
        "What reaching a tool server over the network costs a call: the worker's own MCP client "
        "(`McpServer`) against the same fake tools server twice, a stdio child and a process of its "
        "own serving Streamable HTTP on loopback behind a bearer token, each call `echo` with its "
        f"idempotency key in `_meta`, {c.calls} calls of each shuffled into one random order. Wall is "
        "`McpServer.call`; CPU is the benchmark process's (the client side: what the worker would "
        "spend), the servers' own not counted. Loopback: a real network adds its round trips.\n\n"
        f"Measured by `{c.command}` on {c.date} (code {c.code}; load average at start, at end: {c.load})"
        f"{'; quick mode, a smoke run: not a measurement' if c.quick else ''}; this figure took "
        f"{c.elapsed_s:.0f} s.\n\n" + "\n".join(lines) + "\n\n"
        "A task-backed call against a plain one (worker/tools/tasks.py): the test task server "
        "(`tests/fakes/task_server.py`) on loopback, its `long` tool with `seconds` 0, called plainly "
        "and as an MCP task (`tools/call` with `task`, its id recorded, `tasks/get` at once and then "
        "every `pollInterval` (the server says 100 ms) until it is done, then `tasks/result`), in the "
        "same shuffled order. What a task costs a call that is quick anyway: three requests instead of "
        "one (and a poll interval's wait whenever a `tasks/get` finds it still working).\n\n"
        + "\n".join(tasks)
    )
