"""A real API and worker that the tests of one module share (the Agent Protocol's modules)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.support.env import SophosEnv, make_sophos_env, mcp_servers
from tests.support.ports import free_port
from tests.support.procs import ProcessGroup
from tests.support.redis_server import RedisServer


@contextlib.contextmanager
def approval_stack(root: Path, ollama_url: str) -> Iterator[SophosEnv]:
    """One API and one worker on a Redis of their own (other tests flush theirs), the fake tools
    server's ``add`` asking for approval; stopped, with the Redis, at the end."""
    redis_server = RedisServer(root / "redis", appendonly=False)
    redis_server.start()
    env = make_sophos_env(root, redis_url=redis_server.url, ollama_url=ollama_url, api_port=free_port())
    config: dict[str, Any] = mcp_servers(env.tools_log, root / "empty-bin")
    config["mcpServers"]["tools"]["requireApproval"] = ["add"]
    env.write_mcp_config(config)
    group = ProcessGroup(log_dir=root / "logs", cwd=root)
    try:
        group.start_worker(env)
        group.start_api(env)
        yield env
    finally:
        group.close()
        redis_server.stop()
