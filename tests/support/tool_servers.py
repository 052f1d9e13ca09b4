"""A tool server written for the tests, in a process of its own on loopback (not the worker's), so it
outlives the worker's kill -9: the fake tools server (tests/fakes/tools_server.py ``--http``) or the
task server (tests/fakes/task_server.py ``--http``)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from tests.support.client import tool_log, wait_for
from tests.support.env import TOOLS_SERVER, SophosEnv, make_sophos_env
from tests.support.ports import free_port


class RemoteTools:
    """A test's tool server over Streamable HTTP (``/mcp``) or, with ``start("--sse")``, HTTP+SSE.
    Its calls are logged to the env's ``tools_log``; ``token``: the bearer token it requires."""

    def __init__(self, env: SophosEnv, log: Path, *, token: str = "", script: Path = TOOLS_SERVER) -> None:
        self.port = free_port()
        self.env, self.log, self.token, self.script = env, log, token, script
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self, *transport: str) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, str(self.script), "--http", str(self.port), *transport],
                env={**self.env, "TOOLS_TOKEN": self.token, "TOOLS_LOG": str(self.env.tools_log)},
                stdout=out, stderr=out,
            )

        def listening() -> bool:
            with socket.socket() as probe:
                return probe.connect_ex(("127.0.0.1", self.port)) == 0

        wait_for(listening, timeout=20, message="the remote tools server listening")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


@contextlib.contextmanager
def server_alone(
    root: Path, *transport: str, token: str = "", script: Path = TOOLS_SERVER
) -> Iterator[RemoteTools]:
    """The tool server ``script`` started on ``root`` (``transport``: as :meth:`RemoteTools.start`)
    with no worker nor API, for a test of an MCP session alone; stopped at the end."""
    env = make_sophos_env(root, redis_url="redis://unused", ollama_url="http://unused", api_port=0)
    server = RemoteTools(env, root / "tool-server.log", token=token, script=script)
    server.start(*transport)
    try:
        yield server
    finally:
        server.stop()


def task_endings(tools_log: Path, task_id: str) -> list[str]:
    """How the task server (tests/fakes/task_server.py) says the task's work stopped: ``done`` or
    ``cancelled``, once each time."""
    return [e["event"] for e in tool_log(tools_log) if e.get("task") == task_id and "event" in e]
