"""Figure 22: the crossing, what a run costs each process in system calls, context switches and
Redis commands, against the in-process floor (issue 45, part 1).

One stack (Redis, fake model, worker, API) and the floor (bench/floor.py: the same graph, model
client and tools server in this process, nothing around them). ``runs`` runs one at a time on
each; around each batch every process is counted:

- system calls: ``perf stat -e raw_syscalls:sys_enter`` attached to the process (all its threads),
  where perf is there and allowed; else not measured (said so);
- context switches, voluntary (a wake-up: the process waited for something) and involuntary:
  ``/proc/PID/task/*/status``, summed over the threads (the process's children counted with it:
  the API's reader, the worker's tools server);
- Redis commands: ``INFO commandstats`` of the stack's own Redis (the floor has none).

These counts do not depend on the machine's load, unlike times: the shared machine needs no quiet
spell for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from bench.client import BenchError, chat_once, http_client
from bench.floor import in_process_floor
from bench.runs import MESSAGE
from bench.solo import _commands
from bench.stack import _children, _cmdline, running_stack
from shared.settings import Settings
from tests.support.procs import wait_api_ready, wait_worker_ready


@dataclass(frozen=True, slots=True)
class Sizes:
    warm: int
    runs: int


FULL = Sizes(warm=5, runs=50)
QUICK = Sizes(warm=1, runs=3)


@dataclass
class Counts:
    """One process's counts over a batch of runs (``syscalls`` None: not measured)."""

    syscalls: int | None = None
    voluntary: int = 0
    involuntary: int = 0


@dataclass
class Crossing:
    runs: int
    #: role -> counts over ``runs`` runs, for the service's processes and the floor's
    service: dict[str, Counts] = field(default_factory=dict)
    floor: dict[str, Counts] = field(default_factory=dict)
    redis_commands: int = 0
    #: Redis commands over the runs, by command
    by_command: dict[str, int] = field(default_factory=dict)
    perf: bool = False
    elapsed_s: float = 0.0


def _switches(pids: list[int]) -> tuple[int, int]:
    voluntary = involuntary = 0
    for pid in pids:
        for status in Path(f"/proc/{pid}/task").glob("*/status"):
            with contextlib.suppress(OSError):
                for line in status.read_text().splitlines():
                    if line.startswith("voluntary_ctxt_switches"):
                        voluntary += int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches"):
                        involuntary += int(line.split()[1])
    return voluntary, involuntary


@contextlib.contextmanager
def _counted(roles: Mapping[str, list[int]], into: dict[str, Counts], perf: bool) -> Iterator[None]:
    """Count each role's processes over the block (perf stat per process, /proc switches)."""
    before = {role: _switches(pids) for role, pids in roles.items()}
    watchers: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
    folder = Path(tempfile.mkdtemp(prefix="sophos-crossing-"))
    if perf:
        for role, pids in roles.items():
            out = folder / f"{len(watchers)}.csv"
            watchers[role] = (subprocess.Popen(
                ["perf", "stat", "-x", ",", "-e", "raw_syscalls:sys_enter", "-o", str(out),
                 "-p", ",".join(map(str, pids))],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            ), out)
        time.sleep(0.3)  # perf attached (it counts from when it is, so early is only idle)
    try:
        yield
    finally:
        for role, pids in roles.items():
            after = _switches(pids)
            counts = into.setdefault(role, Counts())
            counts.voluntary += after[0] - before[role][0]
            counts.involuntary += after[1] - before[role][1]
        for role, (popen, out) in watchers.items():
            popen.send_signal(signal.SIGINT)
            popen.wait(10)
            into[role].syscalls = (into[role].syscalls or 0) + _perf_value(out)
        shutil.rmtree(folder, ignore_errors=True)


def _perf_value(out: Path) -> int:
    for line in out.read_text().splitlines():
        fields = line.split(",")
        if len(fields) > 2 and fields[2].startswith("raw_syscalls:sys_enter"):
            return int(fields[0]) if fields[0].isdigit() else 0
    return 0


def perf_works() -> bool:
    """Whether ``perf stat`` can count system calls here (installed, and allowed)."""
    if shutil.which("perf") is None:
        return False
    probe = subprocess.run(["perf", "stat", "-x", ",", "-e", "raw_syscalls:sys_enter", "true"],
                           capture_output=True, text=True, check=False)
    return probe.returncode == 0 and "raw_syscalls" in probe.stderr and "<not" not in probe.stderr


def measure(
    *, quick: bool, overrides: Mapping[str, str] | None = None, keep: bool = False,
    say: Callable[[str], None] = lambda _: None,
) -> Crossing:
    sizes = QUICK if quick else FULL
    started = time.monotonic()
    result = Crossing(runs=sizes.runs, perf=perf_works())
    with running_stack(overrides=overrides, keep=keep) as stack:
        stack.worker = stack.procs.start_worker(stack.env, wait_ready=False)
        stack.api = stack.procs.start_api(stack.env, wait_ready=False)
        wait_worker_ready(stack.worker, stack.redis.url)
        wait_api_ready(stack.api)
        floor_settings = Settings.from_env(stack.settings_env(DATABASE_PATH=str(stack.root / "floor.db")))
        me = os.getpid()
        assert stack.redis.pid is not None
        worker_tools = [c for c in _children(stack.worker.pid) if "tools_server" in _cmdline(c)]
        service_roles = {
            "worker": [stack.worker.pid],
            "worker's tools server": worker_tools,
            "API": [stack.api.pid, *_children(stack.api.pid)],
            "Redis": [stack.redis.pid],
            "client (the benchmark's HTTP client)": [me],
        }

        async def batches() -> None:
            async with in_process_floor(floor_settings, dict(stack.env)) as floor, \
                    http_client(stack.api_url) as http:
                floor_roles = {
                    "the floor's process (graph, model client, saver)": [me],
                    "the floor's tools server": [c for c in _children(me) if "tools_server" in _cmdline(c)],
                }
                for _ in range(sizes.warm):
                    await chat_once(http, MESSAGE)
                    await floor.run(str(uuid.uuid4()), MESSAGE)
                before = _commands(stack.redis.url)
                with _counted(service_roles, result.service, result.perf):
                    for _ in range(sizes.runs):
                        await chat_once(http, MESSAGE)
                after = _commands(stack.redis.url)
                after.subtract(before)
                after["info"] -= 1
                result.redis_commands = sum((+after).values())
                result.by_command = dict((+after).most_common())
                say("figure 22: the service counted")
                with _counted(floor_roles, result.floor, result.perf):
                    for _ in range(sizes.runs):
                        await floor.run(str(uuid.uuid4()), MESSAGE)
                say("figure 22: the floor counted")

        asyncio.run(batches())
    if not result.service:
        raise BenchError("figure 22: nothing counted")
    result.elapsed_s = time.monotonic() - started
    return result


HEADING = "## The crossing: system calls and context switches per run (figure 22)"


def _row(role: str, counts: Counts, runs: int) -> str:
    calls = "n/a" if counts.syscalls is None else f"{counts.syscalls / runs:.0f}"
    return f"| {role} | {calls} | {counts.voluntary / runs:.0f} | {counts.involuntary / runs:.0f} |"


def _total(parts: Mapping[str, Counts]) -> Counts:
    calls = [c.syscalls for c in parts.values()]
    return Counts(
        syscalls=None if any(c is None for c in calls) else sum(c for c in calls if c is not None),
        voluntary=sum(c.voluntary for c in parts.values()),
        involuntary=sum(c.involuntary for c in parts.values()),
    )


def section(c: Crossing, *, stamp: str = "") -> str:
    service, floor = _total(c.service), _total(c.floor)
    ratio = []
    if service.syscalls is not None and floor.syscalls:
        ratio.append(f"system calls {service.syscalls / floor.syscalls:.2f}×")
    if floor.voluntary:
        ratio.append(f"voluntary switches {service.voluntary / floor.voluntary:.2f}×")
    rows = [_row(role, counts, c.runs) for role, counts in c.service.items()]
    rows.append(_row("**the service, all processes**", service, c.runs))
    rows += [_row(role, counts, c.runs) for role, counts in c.floor.items()]
    rows.append(_row("**the floor, all processes**", floor, c.runs))
    return (
        f"{HEADING}\n\n"
        f"{c.runs} runs one at a time on the service, then {c.runs} on the floor (the same graph, model "
        "client and tools server in one process); system calls by `perf stat -e raw_syscalls:sys_enter` "
        + ("" if c.perf else "(not available on this machine: not measured) ")
        + "attached to each process, context switches from `/proc` (all threads; a process's children "
        f"with it). Counts, not times: the machine's load does not move them. Took {c.elapsed_s:.0f} s.\n\n"
        + (f"{stamp.strip()}\n\n" if stamp else "")
        + "| process | system calls per run | voluntary switches per run | involuntary per run |\n"
        + "|---|---:|---:|---:|\n" + "\n".join(rows) + "\n\n"
        + f"Redis commands per run: {c.redis_commands / c.runs:.1f} ("
        + ", ".join(f"`{name}` {n / c.runs:.1f}" for name, n in list(c.by_command.items())[:10])
        + "). The service against the floor: " + (", ".join(ratio) or "n/a") + ".\n"
    )
