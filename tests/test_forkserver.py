"""The tests' forked workers and APIs (tests/support/forkserver.py) are the real entry points.

Each is checked against what ``python -m`` gives: the test's environment, directory and log,
a session of its own, its exit codes (a clean stop, a signal, an argument's answer), and a fresh
process wherever the environment read at start differs from the fork server's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.ollama import FakeOllama, Text
from tests.support import forkserver
from tests.support.client import chat, read_sse
from tests.support.env import SophosEnv
from tests.support.forkserver import ForkedProcess
from tests.support.procs import ProcessGroup

pytestmark = pytest.mark.skipif(not forkserver.enabled(), reason="SOPHOS_TEST_FORK=0: all start fresh")


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[1])


def _cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().rstrip("\0").split("\0")


def test_a_forked_worker_and_api_take_the_tests_environment_and_answer_signals(
    sophos_env: SophosEnv, procs: ProcessGroup, model: FakeOllama
) -> None:
    worker = procs.start_worker(sophos_env)
    api = procs.start_api(sophos_env)  # ready on the port its environment names
    for proc in (worker, api):
        server = _parent(proc.pid)
        assert server != os.getpid()
        assert "tests.support.forkserver" in _cmdline(server) and proc.module in _cmdline(server)
        assert os.getsid(proc.pid) == proc.pid  # a session of its own, as start_new_session gives
        assert Path(os.readlink(f"/proc/{proc.pid}/cwd")) == procs.cwd
        assert [os.readlink(f"/proc/{proc.pid}/fd/{fd}") for fd in (0, 1, 2)] == [
            os.devnull, str(proc.log_path), str(proc.log_path)]

    model.script(Text("Hello from a fork."))
    conversation, _ = chat(api.url or "", "hi")
    assert read_sse(api.url or "", conversation).text == "Hello from a fork."
    worker.wait_for_log("run.finished")

    api.terminate()
    assert api.wait(30) == -signal.SIGTERM  # uvicorn stops cleanly, then raises the signal again
    worker.terminate()
    assert worker.wait(30) == 0
    worker.wait_for_log("worker.stopped")


def test_an_arguments_answer_is_the_same_forked_and_fresh(sophos_env: SophosEnv, procs: ProcessGroup) -> None:
    # No worker runs: `--check` says so, with exit code 1, from a fork as from a fresh process.
    forked = procs.start_worker(sophos_env, wait_ready=False, args=["--check"])
    assert isinstance(forked.popen, ForkedProcess)
    code = forked.wait(60)
    fresh = subprocess.run([sys.executable, "-m", "worker", "--check"], env=sophos_env, cwd=procs.cwd,
                           capture_output=True, text=True, timeout=60)
    assert code == fresh.returncode == 1
    assert forked.log_text() == fresh.stdout + fresh.stderr


def test_an_environment_read_at_start_that_differs_gets_a_fresh_process(
    sophos_env: SophosEnv, procs: ProcessGroup
) -> None:
    forked = procs.start_worker(sophos_env)  # the fork server runs with the session's environment
    assert isinstance(forked.popen, ForkedProcess)
    forked.kill()
    assert forked.wait(30) == -signal.SIGKILL
    loose = sophos_env.with_(LANGGRAPH_STRICT_MSGPACK=None)
    fresh = procs.start_worker(loose)
    assert isinstance(fresh.popen, subprocess.Popen) and _parent(fresh.pid) == os.getpid()
    assert _cmdline(fresh.pid)[-2:] == ["-m", "worker"]
