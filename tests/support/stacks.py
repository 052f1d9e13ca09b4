"""A real worker and API that the tests of one module share, started once for the module.

:func:`module_stack` is the one set-up (tests/test_branches.py, tests/test_fuzz.py,
tests/test_tracing.py); :func:`own_redis_stack` is it on a Redis of its own (tests/test_webhooks.py),
:func:`approval_stack` that with ``add`` asking for approval (the Agent Protocol's modules,
tests/test_approvals.py, tests/test_cli_approve.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis as redis_sync

from tests.fakes.ollama import FakeOllama
from tests.support.env import SophosEnv, make_sophos_env, require_approval
from tests.support.ports import free_port
from tests.support.procs import ProcessGroup, ServiceProcess
from tests.support.redis_server import RedisServer


@dataclass
class Stack:
    """A started worker and API: ``env`` for both, ``group`` to start more (killed at the end)."""

    env: SophosEnv
    group: ProcessGroup
    worker: ServiceProcess

    @property
    def api(self) -> str:
        return self.env.api_url


@contextlib.contextmanager
def module_stack(
    root: Path, redis_url: str, model: FakeOllama, *, approval: Any = None, safe_to_repeat: bool = True,
    **overrides: str,
) -> Iterator[Stack]:
    """One worker and one API on ``root`` (Redis at ``redis_url`` flushed, ``model`` reset first and
    last), with the environment's ``overrides``; with ``approval`` (``True`` or tool names), the
    fake tools server set up by :func:`require_approval` (and ``safe_to_repeat``). Both processes
    are killed at the end."""
    with redis_sync.Redis.from_url(redis_url) as client:
        client.flushall()
    model.reset()
    env = make_sophos_env(root, redis_url=redis_url, ollama_url=model.url, api_port=free_port())
    env = env.with_(**overrides)
    if approval is not None:
        require_approval(env, approval, safe_to_repeat=safe_to_repeat)
    group = ProcessGroup(log_dir=root / "logs", cwd=root)
    try:
        worker = group.start_worker(env)
        group.start_api(env)
        yield Stack(env, group, worker)
    finally:
        group.close()
        model.reset()


@contextlib.contextmanager
def own_redis_stack(root: Path, model: FakeOllama, **options: Any) -> Iterator[Stack]:
    """:func:`module_stack` (with its ``options``) on a Redis of its own: the module's other tests
    flush the session's (``sophos_env``) while its tests run."""
    redis_server = RedisServer(root / "redis", appendonly=False)
    redis_server.start()
    try:
        with module_stack(root, redis_server.url, model, **options) as stack:
            yield stack
    finally:
        redis_server.stop()


@contextlib.contextmanager
def approval_stack(root: Path, model: FakeOllama, **overrides: str) -> Iterator[SophosEnv]:
    """:func:`own_redis_stack` with the fake tools server's ``add`` asking for approval; with the
    environment's ``overrides``."""
    with own_redis_stack(root, model, approval=["add"], safe_to_repeat=True, **overrides) as stack:
        yield stack.env
