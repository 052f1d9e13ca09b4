"""The tests' workers and APIs forked from a process that has already imported them.

A worker's start is mostly imports (LangGraph, langchain-core and langsmith, the MCP client,
ollama's types): about a second of CPU, the API's half that, and the suite starts some 400
workers and 300 APIs on two cores, CPU-bound (docs/contributing.md). So each pytest process
keeps one *fork server* per module (``python -m tests.support.forkserver worker SOCKET``): it
imports what ``python -m worker`` imports at start (:data:`PRELOAD`), then forks a child per
request, which takes the test's environment, working directory and log file, starts a session
of its own and runs the module as ``__main__`` (:mod:`runpy`), as ``python -m`` would. The child
is a real process running the real entry point: signals, exit codes, its own children and its
log are what they would be.

What a fork cannot give, the test gets a fresh ``python -m`` for (:meth:`ForkServers.spawn`
answers ``None``): a module with no fork server, a working directory holding a module of that
name (a test's stand-in, which ``python -m`` finds first), or an environment whose variables read at the
interpreter's start or at import (:data:`STARTUP_PREFIXES`: ``PYTHON*``, LangGraph's strict
msgpack) differ from the server's, as when a test drops ``LANGGRAPH_STRICT_MSGPACK`` to prove
the entry point sets it. ``SOPHOS_TEST_FORK=0`` turns forking off for a run; coverage turns it
off too (tests/support/procs.py), as does the benchmark, which never asks.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import runpy
import select
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: Turn forking off for a test run with ``SOPHOS_TEST_FORK=0``.
SWITCH = "SOPHOS_TEST_FORK"
#: What each module's fork server imports before it serves: what the entry point imports at start
#: (both engines' drivers; a name missing here is imported by the child, only slower).
PRELOAD: dict[str, tuple[str, ...]] = {
    "worker": (
        "worker.jobs", "worker.lock", "worker.queue.wakeup", "worker.check",
        "shared.logging", "shared.tracing", "shared.speedups", "shared.storage.engines",
        "shared.contracts.codec", "shared.redis.connection", "arq.connections", "uvloop",
        "langgraph.checkpoint.sqlite.aio", "langgraph.checkpoint.postgres.aio", "psycopg_pool",
    ),
    "api": (
        "uvicorn", "api.app", "api.auth.bearer", "api.http.parser", "shared.tracing",
        "shared.logging", "shared.speedups", "shared.storage.engines", "shared.users", "shared.errors",
        "uvloop",
    ),
}
#: Environment variables read when the interpreter starts or a module is imported: a request must
#: carry the fork server's values of these, or it gets a fresh process.
STARTUP_PREFIXES = ("PYTHON", "LANGGRAPH_", "LANGCHAIN_", "LANGSMITH_", "OTEL_PYTHON_")
#: How long a request waits for the server to import and answer.
ANSWER_TIMEOUT = 60.0
_PR_SET_PDEATHSIG = 1


def startup_signature(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(STARTUP_PREFIXES)}


def _die_with_parent() -> None:
    """SIGKILL this process when its parent ends (prctl), as ``setpriv --pdeathsig`` does."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


# --- the server -------------------------------------------------------------------------------


def _send(conn: socket.socket, message: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(json.dumps(message).encode() + b"\n")


def _read_line(conn: socket.socket, timeout: float) -> bytes:
    conn.settimeout(timeout)
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def serve(listener: socket.socket) -> dict[str, Any]:
    """Fork a child per request and tell each requester its child's pid, then its exit code.

    Returns only in a child, with the request it is to carry out. One thread: nothing else runs
    while a child is forked."""
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, None)
    waiting: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, the requester)
    while True:
        for key, _ in selector.select():
            if key.data is None:
                conn, _ = listener.accept()
                try:
                    request = json.loads(_read_line(conn, 10.0))
                except (OSError, ValueError):
                    conn.close()
                    continue
                sys.stdout.flush()
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    listener.close()
                    for _, other in waiting.values():
                        other.close()
                    conn.close()
                    return request
                _send(conn, {"pid": pid})
                pidfd = os.pidfd_open(pid)
                waiting[pidfd] = (pid, conn)
                selector.register(pidfd, selectors.EVENT_READ, pidfd)
            else:
                pid, conn = waiting.pop(key.data)
                selector.unregister(key.data)
                os.close(key.data)
                _, status = os.waitpid(pid, 0)
                _send(conn, {"returncode": os.waitstatus_to_exitcode(status)})
                conn.close()


def become(request: dict[str, Any]) -> None:
    """In the forked child: take the request's session, files, directory and environment, then
    run the module as ``python -m`` would (its ``SystemExit`` is this process's exit)."""
    os.setsid()
    _die_with_parent()
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    for fd in [int(name) for name in os.listdir("/proc/self/fd")]:
        if fd > 2:
            with contextlib.suppress(OSError):
                os.close(fd)
    cwd = request["cwd"] or os.getcwd()
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(request["env"])
    if not sys.flags.safe_path:
        sys.path[0] = cwd  # as ``python -m`` puts its working directory first
    sys.argv = [sys.argv[0], *request["args"]]
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)


def main(argv: Sequence[str]) -> None:
    module, path, *flags = argv
    if "--die-with-parent" in flags:
        _die_with_parent()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(f"{path}.binding")
    listener.listen(64)
    os.rename(f"{path}.binding", path)  # the path names a socket that already listens
    for name in PRELOAD[module]:
        with contextlib.suppress(ImportError):
            __import__(name)
    if threading.active_count() != 1:  # a fork would copy another thread's locks mid-use
        raise SystemExit(f"forkserver: {threading.active_count()} threads after importing; no fork")
    fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
    print(f"forkserver {module}: ready, {len(sys.modules)} modules, open fds {fds}", flush=True)
    become(serve(listener))


# --- the client -------------------------------------------------------------------------------


class ForkedProcess:
    """A forked child as the tests use a :class:`subprocess.Popen`: ``pid``, ``poll``, ``wait``,
    ``send_signal``. Its exit code comes from the fork server, its parent."""

    def __init__(self, conn: socket.socket, pid: int, argv: Sequence[str]) -> None:
        self.pid = pid
        self.args = list(argv)
        self.returncode: int | None = None
        self._conn = conn
        self._buffer = b""
        self._lock = threading.Lock()

    def _read(self, timeout: float | None) -> None:
        """Read the server's word on the child for up to ``timeout`` seconds (``None``: until it comes)."""
        with self._lock:
            if self.returncode is not None:
                return
            if not select.select([self._conn], [], [], timeout)[0]:
                return
            chunk = self._conn.recv(4096)
            self._buffer += chunk
            if self._buffer.endswith(b"\n"):
                self.returncode = int(json.loads(self._buffer)["returncode"])
            elif not chunk:  # the fork server is gone, and its children with it (they die with it)
                self.returncode = -signal.SIGKILL
            else:
                return
            self._conn.close()

    def poll(self) -> int | None:
        self._read(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self._read(left if left is None else max(left, 0.001))
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _lifetime() -> list[str]:
    """A server started from the main thread dies with the test run; one started from another
    thread must not (a parent-death signal follows the creating *thread*: tests/support/lifetime.py)
    and is stopped by :meth:`ForkServers.close`."""
    return ["--die-with-parent"] if threading.current_thread() is threading.main_thread() else []


class _Server:
    def __init__(self, module: str, env: Mapping[str, str], folder: Path, argv: Sequence[str]) -> None:
        self.module = module
        self.signature = startup_signature(env)
        self.path = folder / f"{module}.sock"
        with open(folder / f"{module}.log", "ab") as log:
            self.popen = subprocess.Popen(
                [*argv, "-m", "tests.support.forkserver", module, str(self.path), *_lifetime()],
                env=dict(env), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=Path(__file__).resolve().parents[2], start_new_session=True,
            )
        deadline = time.monotonic() + ANSWER_TIMEOUT
        while not self.path.exists():
            if self.popen.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the {module} fork server did not start: see {folder / f'{module}.log'}")
            time.sleep(0.01)

    def fork(self, args: Sequence[str], env: Mapping[str, str], cwd: Path | None, log: Path) -> ForkedProcess:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(str(self.path))
        request = {"module": self.module, "args": list(args), "env": dict(env),
                   "cwd": str(cwd) if cwd else None, "log": str(log)}
        conn.sendall(json.dumps(request).encode() + b"\n")
        answer = _read_line(conn, ANSWER_TIMEOUT)
        if not answer.endswith(b"\n"):
            conn.close()
            raise RuntimeError(f"the {self.module} fork server did not answer (its log: {self.path}.log)")
        return ForkedProcess(conn, int(json.loads(answer)["pid"]), [self.module, *args])

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.popen.kill()
        self.popen.wait(10)


class ForkServers:
    """A pytest process's fork servers, one per module, each started at its first request."""

    def __init__(self, folder: Path, launcher: Sequence[str] = (sys.executable,)) -> None:
        self.folder = folder
        self.launcher = list(launcher)
        self._servers: dict[str, _Server] = {}
        self._lock = threading.Lock()

    def spawn(
        self, module: str, args: Sequence[str], env: Mapping[str, str], cwd: Path | None, log: Path,
    ) -> ForkedProcess | None:
        """``module`` forked with these ``args``, ``env``, ``cwd`` and ``log``; ``None`` when a fresh
        process is needed (see the module's docstring)."""
        if module not in PRELOAD or _shadowed(module, cwd):
            return None
        with self._lock:
            server = self._servers.get(module)
            if server is None or server.popen.poll() is not None:
                server = self._servers[module] = _Server(module, env, self.folder, self.launcher)
        if server.signature != startup_signature(env):
            return None
        return server.fork(args, env, cwd, log)

    def close(self) -> None:
        with self._lock:
            for server in self._servers.values():
                server.close()
            self._servers.clear()


def _shadowed(module: str, cwd: Path | None) -> bool:
    """Whether ``python -m module`` in ``cwd`` would find a module of that name there first (a
    test's stand-in), which a process that has imported the real one cannot."""
    return cwd is not None and ((cwd / f"{module}.py").exists() or (cwd / module).is_dir())


def enabled(env: Mapping[str, str] = os.environ) -> bool:
    return env.get(SWITCH, "1") != "0"


if __name__ == "__main__":
    main(sys.argv[1:])
