"""Per-worker liveness: several workers on one Redis, each with a heartbeat of its own.

Real workers and API, real Redis; two workers share real PostgreSQL. One worker stopping
must leave the others alive to readyz, /metrics and /api/runs, and ``python -m worker
--check`` tells of the worker on its own host, not of one that beats elsewhere.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
import redis as redis_sync

from shared.redis.keys import WORKER_HEARTBEAT, WORKERS, worker_heartbeat_key
from tests.fakes.ollama import FakeOllama
from tests.support.client import get_json, wait_for
from tests.support.env import SophosEnv
from tests.support.metrics import gauge
from tests.support.procs import ServiceProcess
from worker.resources import HEARTBEAT_TTL

ELSEWHERE = "elsewhere:4242:0badbeef"


def worker_check(env: SophosEnv) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker", "--check"], env=env, capture_output=True, text=True, timeout=30
    )


def readyz_status(api_url: str) -> int:
    return httpx.get(f"{api_url}/api/readyz", timeout=10, trust_env=False).status_code


def own_beat(client: redis_sync.Redis, worker: ServiceProcess) -> dict[str, object] | None:
    """The beat under the worker's own key, found by its pid."""
    for member in client.zrange(WORKERS, 0, -1):
        raw = client.get(worker_heartbeat_key(member))
        if raw is not None and json.loads(raw).get("pid") == worker.pid:
            beat: dict[str, object] = json.loads(raw)
            return beat
    return None


@pytest.fixture
def client(sophos_env: SophosEnv) -> Iterator[redis_sync.Redis]:
    connection = redis_sync.Redis.from_url(sophos_env.redis_url, decode_responses=True)
    yield connection
    connection.close()


class TestTwoWorkersOnPostgres:
    @pytest.fixture
    def backend(self) -> str:
        return "postgresql"

    def test_both_count_and_one_stopping_leaves_the_other_ready(
        self, sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama, client: redis_sync.Redis
    ) -> None:
        first, second = start_worker(sophos_env), start_worker(sophos_env)
        api = start_api(sophos_env).url
        wait_for(lambda: gauge(api, "sophos_workers") == 2, timeout=20, message="sophos_workers 2")
        info = wait_for(lambda: (w := get_json(api, "/api/runs")["worker"])["count"] == 2 and w,
                        message="two workers in /api/runs")
        assert info["alive"] is True and info["pid"] in (first.pid, second.pid)
        wait_for(lambda: readyz_status(api) == 200, timeout=20, message="readyz 200")
        beats = [
            wait_for(lambda w=w: own_beat(client, w), message=f"{w.name}'s own beat") for w in (first, second)
        ]
        assert {b["host"] for b in beats} == {socket.gethostname()}
        assert len({b["id"] for b in beats}) == 2
        for beat in beats:
            assert 0 < client.ttl(worker_heartbeat_key(str(beat["id"]))) <= HEARTBEAT_TTL
        assert 0 < client.ttl(WORKERS) <= HEARTBEAT_TTL

        first.signal(signal.SIGTERM)
        statuses = []
        deadline = time.monotonic() + 60  # SHUTDOWN_TIMEOUT and closing, with room to spare
        while first.alive and time.monotonic() < deadline:
            statuses.append(readyz_status(api))
        assert not first.alive, "the stopped worker did not exit"
        statuses.append(readyz_status(api))
        assert first.returncode == 0, first.log_tail()
        assert statuses and set(statuses) == {200}, statuses

        assert client.get(worker_heartbeat_key(str(beats[0]["id"]))) is None
        assert client.zrange(WORKERS, 0, -1) == [beats[1]["id"]]
        # The aggregate older readers know still tells of a live worker: the second.
        assert json.loads(client.get(WORKER_HEARTBEAT) or "{}")["pid"] == second.pid
        assert gauge(api, "sophos_workers") == 1
        info = get_json(api, "/api/runs")["worker"]
        assert info["count"] == 1 and info["alive"] is True and info["pid"] == second.pid
        alive = worker_check(sophos_env)
        assert alive.returncode == 0, alive.stderr
        assert f"pid {second.pid}" in alive.stdout and f"pid {first.pid}" not in alive.stdout


def beat_elsewhere(client: redis_sync.Redis) -> None:
    """A live worker's beat from another host, written as a worker writes it."""
    seconds, micros = client.time()
    now = seconds + micros / 1e6
    beat = {"id": ELSEWHERE, "host": "elsewhere", "pid": 4242, "started_at": now - 60, "beat_at": now}
    client.set(worker_heartbeat_key(ELSEWHERE), json.dumps(beat), ex=HEARTBEAT_TTL)
    client.zadd(WORKERS, {ELSEWHERE: now})
    client.expire(WORKERS, HEARTBEAT_TTL)


def test_check_tells_of_this_hosts_worker_not_one_elsewhere(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama, client: redis_sync.Redis
) -> None:
    beat_elsewhere(client)
    dead = worker_check(sophos_env)
    assert dead.returncode == 1, dead.stdout
    assert "no live worker on this host" in dead.stderr and "pid 4242 on elsewhere" in dead.stderr

    worker = start_worker(sophos_env)
    beat_elsewhere(client)
    alive = worker_check(sophos_env)
    assert alive.returncode == 0, alive.stderr
    assert alive.stdout.startswith("worker alive") and f"pid {worker.pid}" in alive.stdout
    assert "4242" not in alive.stdout
    api = start_api(sophos_env).url
    wait_for(lambda: gauge(api, "sophos_workers") == 2, message="sophos_workers 2 (one of them elsewhere)")

    # Stopping, the worker removes its own heartbeat and nothing of the other's.
    beat_elsewhere(client)
    started = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.log_tail()
    assert time.monotonic() - started < HEARTBEAT_TTL, "the stop removes the worker's keys, not their TTL"
    assert client.zrange(WORKERS, 0, -1) == [ELSEWHERE]
    assert client.get(worker_heartbeat_key(ELSEWHERE)) is not None
    # The aggregate held the stopped worker's beat: it is handed to the live one.
    assert json.loads(client.get(WORKER_HEARTBEAT) or "{}")["id"] == ELSEWHERE
    assert gauge(api, "sophos_workers") == 1
    assert worker_check(sophos_env).returncode == 1


def test_one_worker_stopping_is_seen_at_once(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama, client: redis_sync.Redis
) -> None:
    """The one-worker case as before: its stop leaves no heartbeat to wait out."""
    worker = start_worker(sophos_env)
    api = start_api(sophos_env).url
    wait_for(lambda: readyz_status(api) == 200, timeout=20, message="readyz 200")
    assert get_json(api, "/api/runs")["worker"]["count"] == 1
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.log_tail()
    assert readyz_status(api) == 503
    assert gauge(api, "sophos_workers") == 0
    info = get_json(api, "/api/runs")["worker"]
    assert info["alive"] is False and info["count"] == 0 and info["pid"] == worker.pid
    assert client.zcard(WORKERS) == 0 and client.get(WORKER_HEARTBEAT) is None
