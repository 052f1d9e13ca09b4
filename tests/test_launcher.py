"""``./sophos up`` (scripts/launch.py) as a user runs it: real launcher, worker, API and Redis.

The launcher is pointed at the test's Redis, the fake model and tmp paths (the
env tests/support/env.py builds); its children are found through /proc, killed
with real signals, and waited for as conditions.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared.settings import Settings
from shared.settings_parsing import SettingsError
from tests.fakes.ollama import FakeOllama, Hang, Text
from tests.support.client import get_json, post_chat, read_sse, wait_for
from tests.support.env import SophosEnv
from tests.support.lifetime import die_with_test_run
from tests.support.ports import free_port
from tests.support.procs import HEARTBEAT_KEY, descendant_pids, pid_alive

ROOT = Path(__file__).resolve().parent.parent
LAUNCHER = ROOT / "scripts" / "launch.py"
UP_TIMEOUT = 60.0

pytestmark = pytest.mark.fault


class Launched:
    """One ``scripts/launch.py``, its output in a file, its descendants remembered for teardown."""

    def __init__(self, env: Mapping[str, str], log_path: Path) -> None:
        self.log_path = log_path
        self.seen: set[int] = set()
        with open(log_path, "ab") as log:
            self.popen = subprocess.Popen(
                die_with_test_run([sys.executable, str(LAUNCHER)]), env=dict(env), cwd=ROOT,
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def lines(self) -> list[str]:
        return self.text().splitlines()

    def said(self, pattern: str) -> re.Match[str] | None:
        """The first ``sophos: ...`` line of the launcher matching ``pattern``."""
        for line in self.lines():
            if line.startswith("sophos: ") and (found := re.search(pattern, line)):
                return found
        return None

    def wait_said(self, pattern: str, timeout: float = UP_TIMEOUT) -> re.Match[str]:
        found: re.Match[str] = wait_for(
            lambda: self.said(pattern), timeout=timeout,
            message=lambda: f"launcher line {pattern!r}\n{self.text()[-5000:]}",
        )
        return found

    def descendants(self) -> list[int]:
        """Its children and theirs (MCP servers among them), remembered even once orphaned."""
        pids = descendant_pids(self.pid)
        self.seen.update(pids)
        return pids

    def close(self) -> None:
        self.descendants()
        with contextlib.suppress(ProcessLookupError):
            self.popen.kill()
        self.popen.wait(10)
        for pid in self.seen:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if pid_alive(pid):
                    os.kill(pid, signal.SIGKILL)


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Any]:
    started: list[Launched] = []

    def start(env: Mapping[str, str]) -> Launched:
        launched = Launched(env, tmp_path / f"launcher-{len(started) + 1}.log")
        started.append(launched)
        return launched

    yield start
    for launched in started:
        launched.close()


def heartbeat_pid(redis_url: str) -> int | None:
    import redis

    client = redis.Redis.from_url(redis_url, socket_timeout=2)
    try:
        raw = client.get(HEARTBEAT_KEY)
    finally:
        client.close()
    return int(json.loads(raw)["pid"]) if raw else None


def api_healthy(url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(f"{url}/api/healthz", timeout=2, trust_env=False).status_code == 200
    return False


def up(launched: Launched, env: SophosEnv) -> tuple[int, int]:
    """Wait until the launcher's worker beats and its API answers; their pids."""
    found = launched.wait_said(r"worker pid (\d+), API pid (\d+)")
    worker, api = int(found[1]), int(found[2])
    wait_for(lambda: heartbeat_pid(env.redis_url) == worker, timeout=UP_TIMEOUT,
             message=lambda: f"heartbeat of worker {worker}\n{launched.text()[-5000:]}")
    wait_for(lambda: api_healthy(env.api_url), timeout=UP_TIMEOUT, message="the API's healthz")
    launched.descendants()
    return worker, api


def cli(env: Mapping[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "sophos_cli", *args], env=dict(env), cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _read_aside(process: subprocess.Popen[str]) -> list[str]:
    """What ``process`` writes on stdout, as it comes (read by a thread; ``""`` last, at its end)."""
    shown: list[str] = []

    def read() -> None:
        assert process.stdout is not None
        while chunk := process.stdout.read(1):
            shown.append(chunk)
        shown.append("")

    threading.Thread(target=read, name="cli-stdout", daemon=True).start()
    return shown


def stop_and_check_nothing_is_left(launched: Launched) -> None:
    children = launched.descendants()
    assert children, "the launcher has no children to stop"
    launched.popen.send_signal(signal.SIGINT)
    assert launched.popen.wait(60) == 0, launched.text()[-5000:]
    wait_for(lambda: not [p for p in launched.seen if pid_alive(p)], timeout=20,
             message=lambda: f"every child gone, left: {[p for p in launched.seen if pid_alive(p)]}")


def test_a_killed_worker_is_restarted_the_api_stays_up_and_the_conversation_resumes(
    sophos_env: SophosEnv, model: FakeOllama, launch: Any
) -> None:
    env = sophos_env.with_(API_TOKEN="launch-secret", SOPHOS_TOKEN="launch-secret")
    launched = launch(env)
    worker, api = up(launched, env)
    assert launched.said("is not available") is None  # the model is there: nothing to fix

    thinking = Hang(text="Let me think")
    model.script(thinking)
    watcher = cli(env, "chat", "think hard", "--url", env.api_url)
    shown = _read_aside(watcher)
    try:
        thinking.wait_started(timeout=UP_TIMEOUT)
        conversation = wait_for(lambda: get_json(env.api_url, "/api/conversations", token="launch-secret")
                                ["conversations"], message="the conversation")[0]["id"]
        # Killed once the CLI shows the first token (so it is in the run's event log, and the CLI is
        # on the stream when the run ends), not merely produced.
        wait_for(lambda: "".join(shown).startswith("Let me think"), timeout=UP_TIMEOUT,
                 message=lambda: f"the CLI showing the first token, it showed {''.join(shown)!r}")
        launched.descendants()  # the worker's MCP servers, orphaned by the kill below
        os.kill(worker, signal.SIGKILL)

        launched.wait_said(rf"worker \(pid {worker}\) was killed by SIGKILL; restarting it in 1s")
        launched.wait_said(rf"conversation {conversation} was interrupted; .*"
                           rf"\./sophos chat --resume --conversation {conversation}")
        restarted = int(launched.wait_said(r"worker restarted \(pid (\d+)\)")[1])
        assert restarted != worker
        wait_for(lambda: heartbeat_pid(env.redis_url) == restarted, timeout=UP_TIMEOUT,
                 message="the restarted worker's heartbeat")

        # The CLI waiting on the stream is told the run was interrupted, and how to resume it.
        watcher.wait(timeout=UP_TIMEOUT)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()
    assert watcher.stderr is not None
    err = watcher.stderr.read()
    assert watcher.returncode == 1, err
    wait_for(lambda: shown[-1:] == [""], timeout=10, message="the CLI's output read to its end")
    assert "".join(shown).startswith("Let me think")
    # As it was run, with its --url (sophos_cli/invocation.py).
    client = shlex.join([sys.executable, "-m", "sophos_cli"])
    assert f"resume it with: {client} chat --resume --conversation {conversation} --url {env.api_url}" in err

    # The API never went down: same process, no death reported.
    assert pid_alive(api) and launched.said(r"api \(pid") is None
    assert launched.said(r"redis") is None  # REDIS_URL given: the launcher starts none
    assert get_json(env.api_url, f"/api/conversations/{conversation}", token="launch-secret")["resumable"]
    model.script(Text("Thought it through."))
    # Resumed through the restarted worker, from the CLI's prompt.
    resumed = subprocess.run(
        [sys.executable, "-m", "sophos_cli", "chat", "-c", conversation, "--url", env.api_url],
        env=dict(env), cwd=ROOT, input="/resume\n", capture_output=True, text=True, timeout=UP_TIMEOUT,
    )
    assert resumed.returncode == 0 and resumed.stdout == "Thought it through.\n", resumed.stderr
    detail = get_json(env.api_url, f"/api/conversations/{conversation}", token="launch-secret")
    assert detail["conversation"]["status"] == "completed" and not detail["resumable"]

    # A second death soon after waits twice as long.
    launched.descendants()
    os.kill(restarted, signal.SIGKILL)
    launched.wait_said(rf"worker \(pid {restarted}\) was killed by SIGKILL; restarting it in 2s")
    third = int(wait_for(lambda: [m for m in re.findall(r"worker restarted \(pid (\d+)\)", launched.text())
                                  if int(m) != restarted], timeout=UP_TIMEOUT)[-1])
    wait_for(lambda: heartbeat_pid(env.redis_url) == third, timeout=UP_TIMEOUT, message="third worker")
    assert pid_alive(api)

    stop_and_check_nothing_is_left(launched)


def test_a_killed_api_comes_back_and_the_waiting_cli_loses_no_event(
    sophos_env: SophosEnv, model: FakeOllama, launch: Any
) -> None:
    launched = launch(sophos_env)
    _, api = up(launched, sophos_env)
    answer = Hang(text="The first half, ", then=Text("and the second half."))
    model.script(answer)
    watcher = cli(sophos_env, "chat", "tell me", "--url", sophos_env.api_url)
    try:
        answer.wait_started(timeout=UP_TIMEOUT)
        conversation = wait_for(lambda: get_json(sophos_env.api_url, "/api/conversations")["conversations"],
                                message="the conversation")[0]["id"]
        read_sse(sophos_env.api_url, conversation, stop_after=1)  # the first token is out
        launched.descendants()
        os.kill(api, signal.SIGKILL)
        launched.wait_said(rf"api \(pid {api}\) was killed by SIGKILL; restarting it in 1s")
        restarted = int(launched.wait_said(r"api restarted \(pid (\d+)\)")[1])
        wait_for(lambda: api_healthy(sophos_env.api_url), timeout=UP_TIMEOUT, message="the API back")
        answer.release()  # the rest streams only once the API is back
        out, err = watcher.communicate(timeout=UP_TIMEOUT)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.communicate()
    assert watcher.returncode == 0, err
    assert out == "The first half, and the second half.\n"  # nothing missed, nothing twice
    assert "reconnecting" in err and "reconnected, resuming after event" in err
    assert restarted != api
    stop_and_check_nothing_is_left(launched)


@pytest.mark.parametrize("missing", ["server", "model"])
def test_what_is_missing_of_the_model_is_said_with_its_fix_and_the_worker_keeps_going(
    sophos_env: SophosEnv, model: FakeOllama, launch: Any, missing: str
) -> None:
    port = free_port()
    if missing == "server":
        env = sophos_env.with_(OLLAMA_HOST=f"http://127.0.0.1:{port}")
        host, name, problem = f"http://127.0.0.1:{port}", "test-model", "unreachable"
        fix = "start it with `ollama serve`"
    else:
        env = sophos_env.with_(OLLAMA_MODEL="qwen-later")
        host, name, problem = model.url, "qwen-later", "not_pulled"
        fix = "run `ollama pull qwen-later`"
    launched = launch(env)
    up(launched, env)  # the worker beats: a missing model does not stop it

    # The launcher's own line, and the worker's start-up log line (JSON logs here).
    line = launched.wait_said("is not available").string
    assert f"'{name}' at {host}" in line and fix in line, line
    record = wait_for(lambda: [json.loads(x) for x in launched.lines()
                               if x.startswith("{") and '"model.missing"' in x],
                      message="the worker's model.missing line")[0]
    assert record["problem"] == problem and record["host"] == host and record["model"] == name
    assert fix in record["message"]

    ready = get_json(env.api_url, "/api/readyz", expect=503)
    assert ready["checks"]["model"] is False
    assert f"'{name}' at {host}" in ready["error"]["message"] and fix in ready["error"]["message"]

    accepted = post_chat(env.api_url, "hello?")
    conversation = accepted.json()["conversation"]
    failed = read_sse(env.api_url, conversation, timeout=UP_TIMEOUT)[-1]
    assert failed.event == "chat-error" and failed.data["code"] == "MODEL_UNAVAILABLE"
    assert f"'{name}' at {host}" in failed.data["message"] and fix in failed.data["message"]

    # The model comes later: the same worker answers, no restart.
    if missing == "server":
        late = FakeOllama(["test-model"], port=port).start()
    else:
        late = model
        model.models = [*model.models, "qwen-later:latest"]
    try:
        late.script(Text("Here now."))
        get_json(env.api_url, "/api/readyz")
        again = post_chat(env.api_url, "hello again")
        events = read_sse(env.api_url, again.json()["conversation"], timeout=UP_TIMEOUT)
        assert events[-1].event == "end" and events.text == "Here now."
    finally:
        if late is not model:
            late.close()
    assert launched.said("restarting") is None
    stop_and_check_nothing_is_left(launched)


def test_a_setting_a_child_refuses_stops_everything_instead_of_restarting(
    sophos_env: SophosEnv, model: FakeOllama, launch: Any
) -> None:
    # The API refuses to listen beyond loopback without a token (exit 2): restarting cannot help.
    launched = launch(sophos_env.with_(API_HOST="0.0.0.0"))
    wait_for(lambda: launched.descendants() is None or launched.popen.poll() is not None,
             timeout=UP_TIMEOUT, interval=0.02, message="the launcher's exit")
    assert launched.popen.wait() == 2, launched.text()[-5000:]
    assert launched.said(r"api \(pid \d+\) exited with 2: it cannot use its settings")
    assert launched.said("restarting") is None
    wait_for(lambda: not [p for p in launched.seen if pid_alive(p)], timeout=20, message="children gone")


def test_backoff_doubles_to_thirty_seconds_and_starts_over_after_a_stable_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = importlib.util.spec_from_file_location("sophos_launch", LAUNCHER)
    assert spec is not None and spec.loader is not None
    launch = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "sophos_launch", launch)  # dataclasses look their module up
    spec.loader.exec_module(launch)
    backoff = launch.Backoff(reset=60.0)
    assert [backoff.next_delay(up_for=0.5) for _ in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    assert backoff.next_delay(up_for=61.0) == 1
    assert backoff.next_delay(up_for=3.0) == 2


def test_the_launcher_reads_its_settings_through_settings() -> None:
    """``./sophos up``'s own variables are settings like any other (shared/settings.py): parsed,
    checked and named the same way; the launcher reads the environment nowhere else."""
    s = Settings.from_env({})
    assert s.own_redis and s.launch_redis_port is None and s.launch_restart_reset == 60
    assert s.launch_redis_dir == (Path.cwd() / "data" / "redis")
    s = Settings.from_env({
        "REDIS_URL": "redis://127.0.0.1:6390/0", "SOPHOS_REDIS_PORT": "6391", "SOPHOS_REDIS_DIR": "/srv/r",
        "SOPHOS_RESTART_RESET": "5",
    })
    assert not s.own_redis and s.launch_redis_port == 6391 and s.launch_redis_dir == Path("/srv/r")
    assert s.launch_restart_reset == 5
    for variable, value in (("SOPHOS_REDIS_PORT", "70000"), ("SOPHOS_REDIS_PORT", "x"),
                            ("SOPHOS_RESTART_RESET", "-1"), ("SOPHOS_RESTART_RESET", "soon")):
        with pytest.raises(SettingsError) as caught:
            Settings.from_env({variable: value})
        assert caught.value.variable == variable
    source = LAUNCHER.read_text()
    assert source.count("os.environ") == 1 and "Settings.from_env(" in source
    assert "env.get(" not in source  # no variable read by hand


def test_its_own_redis_is_restarted_on_its_port_and_the_launcher_killed_takes_its_children_along(
    sophos_env: SophosEnv, model: FakeOllama, launch: Any, tmp_path: Path
) -> None:
    port = free_port()
    env = sophos_env.with_(REDIS_URL=None, SOPHOS_REDIS_PORT=port, SOPHOS_REDIS_DIR=tmp_path / "own-redis")
    launched = launch(env)
    launched.wait_said(rf"redis on redis://127\.0\.0\.1:{port}/0 \(AOF in {tmp_path / 'own-redis'}\)")
    own = env.with_(REDIS_URL=f"redis://127.0.0.1:{port}/0")
    worker, api = up(launched, own)
    assert any((tmp_path / "own-redis").glob("appendonly*")), "AOF is on"

    redis_pid = next(p for p in launched.descendants() if "redis-server" in Path(f"/proc/{p}/cmdline")
                     .read_bytes().decode(errors="replace"))
    os.kill(redis_pid, signal.SIGKILL)
    launched.wait_said(rf"redis \(pid {redis_pid}\) was killed by SIGKILL; restarting it in 1s")
    launched.wait_said(r"redis restarted \(pid \d+\)")
    model.script(Text("Still here."))  # the worker and the API reconnect to it by themselves
    accepted = wait_for(lambda: (r := post_chat(own.api_url, "still there?")).status_code == 202 and r,
                        timeout=UP_TIMEOUT, message="a run accepted once Redis is back")
    events = read_sse(own.api_url, accepted.json()["conversation"], timeout=UP_TIMEOUT)
    assert events.text == "Still here."
    assert pid_alive(api) and pid_alive(worker)

    # The launcher itself dies (no chance to stop anyone): its children follow it.
    launched.descendants()
    launched.popen.kill()
    launched.popen.wait(10)
    wait_for(lambda: not [p for p in launched.seen if pid_alive(p)], timeout=UP_TIMEOUT,
             message=lambda: f"every child gone, left: {[p for p in launched.seen if pid_alive(p)]}")


def test_a_second_ctrl_c_does_not_wait_for_the_worker_to_drain(
    sophos_env: SophosEnv, model: FakeOllama, launch: Any
) -> None:
    env = sophos_env.with_(SHUTDOWN_TIMEOUT=120)
    launched = launch(env)
    up(launched, env)
    held = Hang(text="Holding")
    model.script(held)
    post_chat(env.api_url, "hold on")
    held.wait_started(timeout=UP_TIMEOUT)
    launched.descendants()
    launched.popen.send_signal(signal.SIGINT)
    launched.wait_said("SIGINT: stopping everything")
    wait_for(lambda: "worker.stopping" in launched.text(), timeout=UP_TIMEOUT, message="the worker draining")
    assert launched.popen.poll() is None  # waiting for the run to reach a step boundary (up to 120 s)
    launched.popen.send_signal(signal.SIGINT)
    launched.wait_said("killing what is left")
    launched.popen.wait(UP_TIMEOUT)
    assert not held.released.is_set()  # it never had to end by itself
    wait_for(lambda: not [p for p in launched.seen if pid_alive(p)], timeout=UP_TIMEOUT,
             message=lambda: f"every child gone, left: {[p for p in launched.seen if pid_alive(p)]}")
