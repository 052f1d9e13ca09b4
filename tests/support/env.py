"""The environment a test gives the worker and the API, and the files it points at."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

FAKES_DIR = Path(__file__).resolve().parent.parent / "fakes"
#: the checkout: on the processes' path, so that a worker asked for a fault (SOPHOS_FAULT_*) can
#: load its hooks from the tests (worker/faults.py, tests/support/fault_hooks.py)
CHECKOUT = FAKES_DIR.parent.parent
TOOLS_SERVER = FAKES_DIR / "tools_server.py"
#: an MCP server whose one tool runs as an MCP task (tests/fakes/task_server.py)
TASK_SERVER = FAKES_DIR / "task_server.py"

SYSTEM_PROMPT = "You are Sophos under test. Answer briefly."

#: Every variable shared/settings.py reads. Inherited values are dropped, so a
#: developer's own API_TOKEN or OLLAMA_HOST never leaks into a test.
SETTINGS_VARIABLES = (
    "DATABASE_PATH",
    "DATABASE_URL",
    "RUN_LEASE_SECONDS",
    "WORKER_CONCURRENCY",
    "REDIS_URL",
    "OLLAMA_HOST",
    "OLLAMA_MODEL",
    "OLLAMA_THINK",
    "CONFIG_DIR",
    "MEMORY_FILE_PATH",
    "AGENT_RECURSION_LIMIT",
    "SHUTDOWN_TIMEOUT",
    "API_HOST",
    "API_PORT",
    "API_TOKEN",
    "ALLOW_UNAUTHENTICATED",
    "FORWARDED_ALLOW_IPS",
    "RATE_LIMIT_PER_MINUTE",
    "EMPTY_THREAD_RETENTION_MINUTES",
    "USER_MAX_EMPTY_THREADS",
    "MAX_STREAMS_PER_CLIENT",
    "CORS_ORIGINS",
    "LOG_FORMAT",
    "LOG_CONTENT",
    "EVENT_RETENTION",
    "EVENT_MAX_PER_RUN",
    "EVENT_COALESCE_MS",
    "EVENT_COALESCE_TOKENS",
    "MAX_BODY_BYTES",
    "MAX_MESSAGE_CHARS",
    "SSE_PING_INTERVAL",
    "SSE_CLIENT_TIMEOUT",
    "POLL_DELAY",
    "MCP_CALL_TIMEOUT",
    "MCP_START_TIMEOUT",
    "MODEL_TIMEOUT",
    "READ_TIMEOUT",
    "WEBHOOK_ALLOW_HTTP",
    "WEBHOOK_ALLOW_PRIVATE",
    "WEBHOOK_ATTEMPTS",
    "WEBHOOK_RETRY_SECONDS",
    "WEBHOOK_TIMEOUT",
    "SOPHOS_FAULT_KILL_AFTER_CHECKPOINT",
    "SOPHOS_FAULT_KILL_BEFORE_CHECKPOINT",
    "SOPHOS_FAULT_HANG_READ",
    "SOPHOS_FAULT_KILL_AFTER_OUTCOME",
    "SOPHOS_FAULT_HOLD_CALL",
    # Tracing (shared/tracing.py): a developer's own collector never receives the tests' runs.
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
)


def mcp_servers(tools_log: Path, empty_dir: Path, *, fetch: bool = False) -> dict[str, Any]:
    """``config/mcp.json`` for tests: the fake tools server and, with ``fetch``, the real fetch
    server (``with_fetch``). Without it by default: it is one more Python process for every
    worker start, and only the tests of the fetch tool call it.

    The fetch server gets a PATH without node (``empty_dir``): with node on PATH,
    its first HTML page makes readabilipy run ``npm install`` into the venv, over
    the network, printing onto the JSON-RPC stdout. Without node it converts HTML
    in pure Python; text/plain is returned raw either way.
    """
    servers: dict[str, Any] = {
        "tools": {
            "command": sys.executable,
            "args": [str(TOOLS_SERVER)],
            "env": {"TOOLS_LOG": str(tools_log)},
        },
    }
    if fetch:
        servers["fetch"] = {
            "command": sys.executable,
            "args": ["-m", "mcp_server_fetch", "--allow-private-ips"],
            "env": {"PATH": str(empty_dir)},
        }
    return {"mcpServers": servers}


def stdio_tools(env: SophosEnv) -> dict[str, Any]:
    """The fake tools server's entry of ``env``'s default mcp.json (over stdio, the worker's child),
    to name beside other servers."""
    tools: dict[str, Any] = mcp_servers(env.tools_log, env.root / "empty-bin")["mcpServers"]["tools"]
    return tools


def with_fetch(env: SophosEnv) -> SophosEnv:
    """``env`` with the real fetch server beside the fake tools server (its mcp.json rewritten)."""
    env.write_mcp_config(mcp_servers(env.tools_log, env.root / "empty-bin", fetch=True))
    return env


def require_approval(env: SophosEnv, tools: Any, *, safe_to_repeat: bool = True) -> None:
    """Rewrite ``env``'s mcp.json: the fake tools server's ``tools`` (``True`` or a list of names)
    ask for ``requireApproval``; ``safe_to_repeat=False``: its calls are taken as calls that act."""
    config = mcp_servers(env.tools_log, env.root / "empty-bin")
    config["mcpServers"]["tools"]["requireApproval"] = tools
    env.write_mcp_config(config if safe_to_repeat else not_safe_to_repeat(config))


def not_safe_to_repeat(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with the fake tools server's tools taken as not safe to repeat
    (``"safeToRepeat": false`` overrides their ``readOnlyHint``): a call of one that may have run
    when its worker died is asked about, as a call that acts would be (worker/tools/ledger/)."""
    config["mcpServers"]["tools"]["safeToRepeat"] = False
    return config


class SophosEnv(dict[str, str]):
    """Environment variables for a worker or API process, with the test's paths at hand."""

    root: Path
    tools_log: Path

    @property
    def database_path(self) -> Path:
        return Path(self["DATABASE_PATH"])

    @property
    def config_dir(self) -> Path:
        return Path(self["CONFIG_DIR"])

    @property
    def redis_url(self) -> str:
        return self["REDIS_URL"]

    @property
    def api_url(self) -> str:
        """URL of an API started on this env's API_PORT."""
        return f"http://{self.get('API_HOST', '127.0.0.1')}:{self['API_PORT']}"

    def __repr__(self) -> str:
        # Only what we set: the inherited environment would flood every traceback.
        ours = {k: v for k, v in self.items() if k in SETTINGS_VARIABLES}
        return f"SophosEnv(root={getattr(self, 'root', None)}, {ours})"

    def with_(self, **changes: str | int | float | None) -> SophosEnv:
        """A copy with variables changed (``None`` removes one)."""
        new = SophosEnv(self)
        new.root, new.tools_log = self.root, self.tools_log
        for key, value in changes.items():
            if value is None:
                new.pop(key, None)
            else:
                new[key] = str(value)
        return new

    def write_mcp_config(self, config: Mapping[str, object]) -> None:
        (self.config_dir / "mcp.json").write_text(json.dumps(config, indent=2))

    def write_system_prompt(self, text: str) -> None:
        (self.config_dir / "system.md").write_text(text)


def make_sophos_env(
    root: Path,
    *,
    redis_url: str,
    ollama_url: str,
    api_port: int,
    model: str = "test-model",
    base: Mapping[str, str] | None = None,
    **overrides: str,
) -> SophosEnv:
    """Write ``root/config`` and return the environment for processes using ``root``.

    The database directory is not created: the worker must create it itself.
    """
    config_dir = root / "config"
    config_dir.mkdir(parents=True, exist_ok=True)
    tools_log = root / "tools.log"
    empty_dir = root / "empty-bin"
    empty_dir.mkdir(exist_ok=True)
    (config_dir / "system.md").write_text(SYSTEM_PROMPT + "\n")
    (config_dir / "mcp.json").write_text(json.dumps(mcp_servers(tools_log, empty_dir), indent=2))

    inherited = dict(os.environ if base is None else base)
    for name in SETTINGS_VARIABLES:
        inherited.pop(name, None)
    env = SophosEnv(
        {
            **inherited,
            "DATABASE_PATH": str(root / "db" / "sophos.db"),
            "REDIS_URL": redis_url,
            "OLLAMA_HOST": ollama_url,
            "OLLAMA_MODEL": model,
            "CONFIG_DIR": str(config_dir),
            "MEMORY_FILE_PATH": str(root / "memory" / "memory.jsonl"),
            "LOG_FORMAT": "json",
            "API_HOST": "127.0.0.1",
            "API_PORT": str(api_port),
            "SSE_PING_INTERVAL": "1",
            "SHUTDOWN_TIMEOUT": "10",
            "LANGGRAPH_STRICT_MSGPACK": "true",
            "PYTHONPATH": os.pathsep.join(p for p in (str(CHECKOUT), inherited.get("PYTHONPATH")) if p),
            # Logs reach the file before a SIGKILL; loopback never goes through a proxy.
            "PYTHONUNBUFFERED": "1",
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
            **overrides,
        }
    )
    env.root = root
    env.tools_log = tools_log
    return env
