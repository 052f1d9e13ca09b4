"""A module's API (and worker) beside a tool server of the tests' own (:class:`RemoteTools`), on
SQLite or PostgreSQL: the one set-up of tests/test_tool_tasks.py, tests/test_remote_tools.py and
tests/test_kill_points.py. The tool server is a process of its own on loopback, so it outlives the
worker's kill -9; each module says which servers the worker's mcp.json names."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis as redis_sync

from tests.support.env import TOOLS_SERVER, SophosEnv, make_sophos_env
from tests.support.ports import free_port
from tests.support.postgres import engine_overrides
from tests.support.procs import ProcessGroup, ServiceProcess
from tests.support.tool_servers import RemoteTools


@dataclass
class ToolStack:
    """The started stack: ``server`` the test's tool server, ``worker`` the module's worker (None
    without one), ``engine`` ``"sqlite"`` or ``"postgresql"``."""

    env: SophosEnv
    group: ProcessGroup
    server: RemoteTools
    engine: str
    worker: ServiceProcess | None = None

    @property
    def api(self) -> str:
        return self.env.api_url

    def logs(self) -> str:
        """Everything the module's worker and API wrote."""
        return "".join(p.read_text(errors="replace") for p in self.group.log_dir.glob("*") if p.is_file())


def engine_env(
    request: pytest.FixtureRequest, root: Path, redis_url: str, ollama_url: str, **overrides: Any
) -> SophosEnv:
    """The environment for processes on ``root`` on the engine ``request.param`` names (on
    PostgreSQL a database of its own and a short lease: :func:`engine_overrides`), with the
    environment's ``overrides``."""
    env = make_sophos_env(root, redis_url=redis_url, ollama_url=ollama_url, api_port=free_port())
    return env.with_(**overrides, **engine_overrides(request, request.param))


@contextlib.contextmanager
def tool_stack(
    request: pytest.FixtureRequest, root: Path, redis_url: str, ollama_url: str,
    servers: Callable[[SophosEnv, RemoteTools], dict[str, Any]], *, script: Path = TOOLS_SERVER,
    token: str = "", worker: bool = True, **overrides: Any,
) -> Iterator[ToolStack]:
    """:func:`engine_env` (with ``overrides``), the tool server ``script`` (behind ``token``), the
    worker's mcp.json ``{"mcpServers": servers(env, server)}``, Redis at ``redis_url`` flushed, then
    the API and, with ``worker``, a worker. All of it stopped at the end."""
    env = engine_env(request, root, redis_url, ollama_url, **overrides)
    server = RemoteTools(env, root / "tool-server.log", token=token, script=script)
    env.write_mcp_config({"mcpServers": servers(env, server)})
    with redis_sync.Redis.from_url(redis_url) as client:
        client.flushall()
    group = ProcessGroup(log_dir=root / "logs", cwd=root)
    server.start()
    try:
        stack = ToolStack(env, group, server, request.param)
        if worker:
            stack.worker = group.start_worker(env)
        group.start_api(env)
        yield stack
    finally:
        group.close()
        server.stop()
