"""The service under test, as real processes: Redis, the fake model, the worker, the API.

Built from the test harness (``tests/support``): the same environment the
end-to-end tests give the processes, except that ``mcp.json`` names only the
local tools server and the SSE ping interval is the default one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.model_server import MODEL
from tests.support.env import TOOLS_SERVER, SophosEnv, make_sophos_env
from tests.support.lifetime import die_with_test_run
from tests.support.ports import free_port
from tests.support.procs import ProcessGroup, ServiceProcess, wait_api_ready, wait_worker_ready
from tests.support.redis_server import RedisServer

KIB = 1024


def tools_only_mcp_config() -> dict[str, Any]:
    """``mcp.json`` with the one local FastMCP stdio server of the test harness."""
    return {"mcpServers": {"tools": {"command": sys.executable, "args": [str(TOOLS_SERVER)]}}}


def rss_bytes(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of ``pid`` in bytes, from /proc."""
    values = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0]) * KIB
    return values.get("VmRSS", 0), values.get("VmHWM", 0)


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` so far (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class ModelServer:
    """``python -m bench.model_server`` as a child process; ``latency``: seconds before each reply;
    ``calls``: tool calls in an answer that makes them."""

    def __init__(self, log_path: Path, latency: float = 0.0, calls: int = 1) -> None:
        repo = Path(__file__).resolve().parent.parent
        command = [sys.executable, "-m", "bench.model_server"]
        if latency:
            command += ["--latency", str(latency)]
        if calls != 1:
            command += ["--calls", str(calls)]
        with open(log_path, "ab") as log:
            self.popen = subprocess.Popen(
                die_with_test_run(command),
                cwd=repo,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
            )
        assert self.popen.stdout is not None
        line = self.popen.stdout.readline()
        if not line:
            raise RuntimeError(f"the model server exited at start; see {log_path}")
        self.url: str = json.loads(line)["url"]

    def close(self) -> None:
        if self.popen.poll() is None:
            assert self.popen.stdin is not None
            self.popen.stdin.close()  # EOF: it stops
            try:
                self.popen.wait(5)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)


@dataclass
class Stack:
    root: Path
    redis: RedisServer
    model: ModelServer
    env: SophosEnv
    procs: ProcessGroup
    keep: bool = False
    worker: ServiceProcess | None = None
    api: ServiceProcess | None = None
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def api_url(self) -> str:
        assert self.api is not None and self.api.url
        return self.api.url

    @property
    def database_path(self) -> Path:
        return self.env.database_path

    def start_worker(self, **changes: str) -> ServiceProcess:
        """``changes``: environment of this worker only, e.g. ``WORKER_CONCURRENCY="4"``."""
        self.worker = self.procs.start_worker(self.env.with_(**changes) if changes else self.env)
        return self.worker

    def stop_worker(self) -> None:
        """SIGTERM: the worker drains, closes SQLite (checkpointing its WAL) and MCP, exits."""
        if self.worker is not None:
            self.worker.stop(timeout=30)
            self.worker = None

    def start_api(self) -> ServiceProcess:
        self.api = self.procs.start_api(self.env)
        return self.api

    def start(self, **worker_changes: str) -> tuple[ServiceProcess, ServiceProcess]:
        """The worker (``worker_changes``: its environment only) and the API, started side by side
        (:func:`start_side_by_side`)."""
        start_side_by_side(self, worker_changes=worker_changes)
        assert self.worker is not None and self.api is not None
        return self.worker, self.api

    def worker_records(self) -> list[dict[str, Any]]:
        records: list[dict[str, Any]] = []
        for proc in self.procs.processes:
            if proc.module == "worker":
                records.extend(proc.log_records())
        return records

    def cpu_snapshot(self) -> dict[str, float]:
        """CPU seconds used so far by each process of the benchmark, by role."""
        me = os.getpid()
        roles: dict[str, list[int]] = {
            "benchmark process (clients, floor graph)": [me],
            "fake model": [self.model.popen.pid],
            "redis": [self.redis.pid] if self.redis.pid else [],
            "floor's MCP server": [c for c in _children(me) if "tools_server" in _cmdline(c)],
        }
        if self.worker is not None:
            roles["worker"] = [self.worker.pid]
            roles["worker's MCP server"] = [
                c for c in _children(self.worker.pid) if "tools_server" in _cmdline(c)
            ]
        if self.api is not None:
            roles["API"] = [self.api.pid]
        return {role: sum(cpu_seconds(p) for p in pids) for role, pids in roles.items()}

    def settings_env(self, **changes: str) -> dict[str, str]:
        """The environment as a plain mapping (for ``Settings.from_env``), with changes."""
        return {**self.env, **changes}


def start_side_by_side(*stacks: Stack, worker_changes: Mapping[str, str] | None = None) -> None:
    """Start every stack's worker and API at once, none waiting for another to be ready (their
    start-ups overlap), then wait until each is. ``worker_changes``: environment of the workers only."""
    for stack in stacks:
        env = stack.env.with_(**worker_changes) if worker_changes else stack.env
        stack.worker = stack.procs.start_worker(env, wait_ready=False)
        stack.api = stack.procs.start_api(stack.env, wait_ready=False)
    for stack in stacks:
        assert stack.worker is not None and stack.api is not None
        wait_worker_ready(stack.worker, stack.redis.url)
        wait_api_ready(stack.api)


@contextlib.contextmanager
def running_stack(
    *,
    overrides: Mapping[str, str] | None = None,
    keep: bool = False,
    root: Path | None = None,
    model_latency: float = 0.0,
    model_calls: int = 1,
) -> Iterator[Stack]:
    """Redis (AOF on, as deployed), the fake model and the API; the worker is started by the caller.

    ``overrides``: extra environment for the worker and the API (``--env NAME=VALUE``),
    e.g. ``POLL_DELAY`` to try a tuning without editing the code. ``model_latency``:
    seconds the fake model waits before each reply starts; ``model_calls``: tool calls in
    its answer that makes them.
    """
    root = Path(tempfile.mkdtemp(prefix="sophos-bench-")) if root is None else root
    root.mkdir(parents=True, exist_ok=True)
    redis = RedisServer(root / "redis", appendonly=True)
    model: ModelServer | None = None
    procs = ProcessGroup(log_dir=root / "logs", cwd=root)
    try:
        redis.start()
        (root / "logs").mkdir(exist_ok=True)
        model = ModelServer(root / "logs" / "model.log", model_latency, model_calls)
        env = make_sophos_env(
            root,
            redis_url=redis.url,
            ollama_url=model.url,
            api_port=free_port(),
            model=MODEL,
        ).with_(
            SSE_PING_INTERVAL=None,
            # One client address carries the load of many users here: per-client limits off.
            RATE_LIMIT_PER_MINUTE=0,
            MAX_STREAMS_PER_CLIENT=0,
            **dict(overrides or {}),
        )
        env.write_mcp_config(tools_only_mcp_config())
        stack = Stack(
            root=root, redis=redis, model=model, env=env, procs=procs, keep=keep, extra=dict(overrides or {})
        )
        yield stack
    finally:
        procs.close()
        if model is not None:
            model.close()
        redis.stop()
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


def describe_machine() -> dict[str, str]:
    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) // 1024} MiB"
                break
    return {
        "nproc": str(os.cpu_count()),
        "cpu": cpu,
        "memory": mem,
        "python": sys.version.split()[0],
        "kernel": os.uname().release,
    }


def load_average() -> str:
    """The 1, 5 and 15 minute load averages: how busy the shared machine was."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def code_version() -> str:
    """The commit measured, and whether the service's code had uncommitted changes."""
    repo = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "api", "worker", "shared"],
            cwd=repo,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head}{' with uncommitted changes in api/, worker/ or shared/' if dirty else ''}"
