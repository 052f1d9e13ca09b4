"""The worker and the API as real processes, killed with real signals.

Each process runs ``python -m worker`` or ``python -m api`` (or is forked, ready imported,
from a fork server that runs the module as ``python -m`` would: tests/support/forkserver.py)
in a session of its own (so teardown can kill it together with its MCP children), with stdout
and stderr in one log file. :class:`ProcessGroup` (the ``procs`` fixture) keeps every
process a test started and kills them all at teardown.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import redis

from tests.support.forkserver import ForkedProcess, ForkServers
from tests.support.http import http_client
from tests.support.lifetime import die_with_test_run
from tests.support.ports import free_port

#: Written by the worker once it is up (see shared.redis.keys.WORKER_HEARTBEAT): the last
#: writer's beat when several workers share the Redis.
HEARTBEAT_KEY = "sophos:worker:heartbeat"
#: The workers that beat (shared.redis.keys.WORKERS); each one's own beat is under
#: ``HEARTBEAT_KEY:<member>``.
WORKERS_KEY = "sophos:workers"

READY_TIMEOUT = 30.0
#: Set (by coverage's ``patch = ["subprocess"]``) when this test run measures coverage.
MEASURING_COVERAGE = "COVERAGE_PROCESS_CONFIG" in os.environ
#: How long teardown waits for SIGTERMed processes before SIGKILL, when measuring coverage.
COVERAGE_STOP_SECONDS = 3.0
LOG_TAIL_CHARS = 20_000
#: Where workers and APIs are forked from (tests/support/forkserver.py): set for the test session
#: by tests/conftest.py; ``None`` (the benchmark, a plain import) starts each with ``python -m``.
FORK_SERVERS: ForkServers | None = None


class ProcessStartError(RuntimeError):
    """A service process exited or never became ready; the message carries its log."""


class ServiceProcess:
    """One running ``python -m <module>`` with its log file."""

    def __init__(
        self,
        name: str,
        module: str,
        env: Mapping[str, str],
        log_path: Path,
        *,
        args: Sequence[str] = (),
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.module = module
        self.env = dict(env)
        self.log_path = log_path
        self.argv = [sys.executable, "-m", module, *args]
        self.url: str | None = None  # set for API processes
        # Descendants seen so far, as (pid, start time): the MCP servers run in
        # sessions of their own, and once we are dead they can only be found here.
        self._seen: set[tuple[int, int]] = set()
        log_path.parent.mkdir(parents=True, exist_ok=True)
        forked = None
        if FORK_SERVERS is not None and not MEASURING_COVERAGE:
            forked = FORK_SERVERS.spawn(module, args, self.env, cwd, log_path)
        if forked is not None:
            self.popen: subprocess.Popen[bytes] | ForkedProcess = forked
            return
        with open(log_path, "ab") as log:
            self.popen = subprocess.Popen(
                die_with_test_run(self.argv),
                env=self.env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: MCP children die with it at teardown
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int, *, group: bool = False) -> None:
        """Send ``sig`` to the process (or to its whole process group)."""
        if self.popen.poll() is not None:
            return
        self.descendants()  # remember them: after this signal they may be orphans
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(self.popen.pid, sig)
            else:
                self.popen.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL the process alone: its MCP children are left to notice on their own."""
        self.signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.signal(signal.SIGTERM)

    def wait(self, timeout: float = 30.0) -> int:
        """Wait for the exit and return the return code (negative: killed by that signal)."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(
                f"{self.name} (pid {self.pid}) still running after {timeout}s\n{self.log_tail()}"
            ) from None

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM, then SIGKILL the group if it is not gone within ``timeout``."""
        self.terminate()
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill_group()
            return self.popen.wait(5)

    def descendants(self) -> list[int]:
        """Pids of the live process's children, grandchildren... (MCP servers among them)."""
        pids = descendant_pids(self.pid) if self.alive else []
        for pid in pids:
            started = _start_time(pid)
            if started is not None:
                self._seen.add((pid, started))
        return pids

    def stray_descendants(self) -> list[int]:
        """Descendants seen earlier that are still alive, though perhaps orphaned now."""
        return [pid for pid, started in self._seen if _start_time(pid) == started and pid_alive(pid)]

    def kill_group(self) -> None:
        """SIGKILL the process, its process group and its descendants.

        The MCP client starts each stdio server in a session of its own, so they are
        not in our process group: they are found through their parent pids, or
        remembered from earlier looks (signal, readiness) if their parent is gone.
        """
        self.descendants()
        stray = self.stray_descendants()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        for pid in stray:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(5)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        text = self.log_text()
        return text if len(text) <= chars else "...\n" + text[-chars:]

    def log_records(self) -> list[dict[str, Any]]:
        """The log lines that are JSON objects (LOG_FORMAT=json), parsed."""
        records = []
        for line in self.log_text().splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    records.append(json.loads(line))
        return records

    def wait_for_log(self, needle: str | Callable[[str], bool], timeout: float = 30.0) -> str:
        """Wait until the log contains ``needle`` (or a line satisfies it); return that line."""
        deadline = time.monotonic() + timeout
        while True:
            for line in self.log_text().splitlines():
                if (needle in line) if isinstance(needle, str) else needle(line):
                    return line
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{self.name}: no log line matching {needle!r} within {timeout}s\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def __repr__(self) -> str:
        return f"ServiceProcess({self.name!r}, pid={self.pid}, returncode={self.returncode})"


def _parent_pids() -> dict[int, int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # the command name (field 2) may contain spaces and parentheses: split after the last ')'
        fields = stat.rsplit(")", 1)[1].split()
        parents[int(entry)] = int(fields[1])
    return parents


def _start_time(pid: int) -> int | None:
    """Start time of ``pid`` (clock ticks since boot): tells a pid from its reuse."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def descendant_pids(pid: int) -> list[int]:
    """Live descendants of ``pid`` (Linux /proc), children first."""
    parents = _parent_pids()
    found: list[int] = []
    frontier = [pid]
    while frontier:
        parent = frontier.pop(0)
        children = [child for child, ppid in parents.items() if ppid == parent]
        found.extend(children)
        frontier.extend(children)
    return found


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _heartbeat_pid(client: redis.Redis) -> int | bool | None:
    """The pid in the worker heartbeat; None if there is none; True if present without a pid.

    The key can expire between two reads (a killed worker's last beat ends its TTL): a read
    that finds nothing is no heartbeat, never one "without a pid".
    """
    kind = client.type(HEARTBEAT_KEY)
    kind = kind.decode() if isinstance(kind, bytes) else kind
    raw: Any = None
    if kind == "hash":
        raw = client.hget(HEARTBEAT_KEY, "pid")
        if raw is None and not client.exists(HEARTBEAT_KEY):
            return None
    elif kind == "string":
        value = client.get(HEARTBEAT_KEY)
        if value is None:
            return None
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            raw = json.loads(value).get("pid")  # type: ignore[arg-type]
    else:
        return None
    try:
        return int(raw)
    except (TypeError, ValueError):
        return True


def _own_heartbeat_pids(client: redis.Redis) -> set[int]:
    """The pids in the per-worker heartbeats (several workers on one Redis)."""
    pids = set()
    members: list[bytes] = client.zrange(WORKERS_KEY, 0, -1)  # type: ignore[assignment]  # sync client
    for member in members:
        name = member.decode() if isinstance(member, bytes) else str(member)
        value = client.get(f"{HEARTBEAT_KEY}:{name}")
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            pids.add(int(json.loads(value).get("pid")))  # type: ignore[arg-type]
    return pids


def wait_worker_ready(proc: ServiceProcess, redis_url: str, timeout: float = READY_TIMEOUT) -> None:
    """Wait until the worker's heartbeat is in Redis (naming this pid, when it names one).

    A heartbeat left by a worker killed a moment ago still lives for its TTL, so a
    heartbeat naming another pid does not count. Its own heartbeat counts even when
    another worker's beat holds the aggregate one.
    """
    deadline = time.monotonic() + timeout
    client = redis.Redis.from_url(redis_url, socket_timeout=2, socket_connect_timeout=2)
    try:
        while True:
            if not proc.alive:
                raise ProcessStartError(
                    f"{proc.name} exited with {proc.returncode} before it was ready\n{proc.log_tail()}"
                )
            with contextlib.suppress(redis.exceptions.RedisError):
                pid = _heartbeat_pid(client)
                if pid is True or pid == proc.pid or proc.pid in _own_heartbeat_pids(client):
                    proc.descendants()
                    return
            if time.monotonic() > deadline:
                raise ProcessStartError(
                    f"{proc.name} wrote no heartbeat ({HEARTBEAT_KEY}) within {timeout}s\n{proc.log_tail()}"
                )
            time.sleep(0.05)
    finally:
        client.close()


def wait_api_ready(proc: ServiceProcess, timeout: float = READY_TIMEOUT) -> None:
    """Wait until ``GET /api/healthz`` answers 200."""
    assert proc.url
    deadline = time.monotonic() + timeout
    with http_client(base_url=proc.url, timeout=2) as http:
        while True:
            if not proc.alive:
                raise ProcessStartError(
                    f"{proc.name} exited with {proc.returncode} before it was ready\n{proc.log_tail()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if http.get("/api/healthz").status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise ProcessStartError(
                    f"{proc.name}: /api/healthz not 200 within {timeout}s\n{proc.log_tail()}"
                )
            time.sleep(0.05)


class ProcessGroup:
    """The service processes of one test; :meth:`close` kills whatever is left."""

    def __init__(self, log_dir: Path, cwd: Path | None = None) -> None:
        self.log_dir = log_dir
        self.cwd = cwd
        self.processes: list[ServiceProcess] = []
        self._counts: dict[str, int] = {}

    def _name(self, kind: str) -> str:
        self._counts[kind] = self._counts.get(kind, 0) + 1
        return f"{kind}-{self._counts[kind]}"

    def start_worker(
        self,
        env: Mapping[str, str],
        *,
        wait_ready: bool = True,
        args: Sequence[str] = (),
        timeout: float = READY_TIMEOUT,
    ) -> ServiceProcess:
        """Start ``python -m worker``; by default wait for its heartbeat (or its death)."""
        name = self._name("worker")
        proc = ServiceProcess(name, "worker", env, self.log_dir / f"{name}.log", args=args, cwd=self.cwd)
        self.processes.append(proc)
        if wait_ready:
            wait_worker_ready(proc, env["REDIS_URL"], timeout)
        return proc

    def start_api(
        self,
        env: Mapping[str, str],
        *,
        port: int | None = None,
        wait_ready: bool = True,
        args: Sequence[str] = (),
        timeout: float = READY_TIMEOUT,
    ) -> ServiceProcess:
        """Start ``python -m api`` and wait for ``/api/healthz``.

        The port is ``port`` if given, else the env's ``API_PORT`` unless a live API
        of this test already uses it, else a fresh free port. ``proc.url`` is its base URL.
        """
        if port is None:
            taken = {p.env.get("API_PORT") for p in self.processes if p.module == "api" and p.alive}
            wanted = env.get("API_PORT")
            port = int(wanted) if wanted and wanted not in taken else free_port()
        env = {**env, "API_PORT": str(port)}
        host = env.get("API_HOST") or "127.0.0.1"
        name = self._name("api")
        proc = ServiceProcess(name, "api", env, self.log_dir / f"{name}.log", args=args, cwd=self.cwd)
        proc.url = f"http://{host}:{port}"
        self.processes.append(proc)
        if wait_ready:
            wait_api_ready(proc, timeout)
        return proc

    def report_sections(self) -> list[tuple[str, str]]:
        return [
            (f"{p.name} (pid {p.pid}, returncode {p.returncode}) log {p.log_path}", p.log_tail() or "(empty)")
            for p in self.processes
        ]

    def close(self) -> None:
        if MEASURING_COVERAGE:
            self._stop_for_coverage()
        for proc in self.processes:
            proc.kill_group()

    def _stop_for_coverage(self) -> None:
        """SIGTERM what is still running and give it a moment to exit by itself.

        A process killed with SIGKILL never writes its coverage data; one stopped with SIGTERM
        does, at exit. Only when coverage is measured: otherwise teardown stays an instant kill.
        """
        running = [proc for proc in self.processes if proc.alive]
        for proc in running:
            proc.terminate()
        deadline = time.monotonic() + COVERAGE_STOP_SECONDS
        for proc in running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(max(0.0, deadline - time.monotonic()))
