"""Remote tool servers in mcp.json (worker/tools/config.py): how they are read, what a missing
variable says, and that a server's secrets are taken out of what the worker writes about it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from worker.tools.config import REDACTED, Secrets, load_config
from worker.tools.mcp import McpServer
from worker.tools.policy import McpConfigError

TOKEN = "tok-4c1d9e0b"


def _write(tmp_path: Path, servers: dict[str, object]) -> Path:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": servers}))
    return path


def test_a_remote_server_is_read_with_its_transport_and_its_secrets(tmp_path: Path) -> None:
    path = _write(tmp_path, {
        "crm": {"url": "https://crm.example/mcp", "headers": {"Authorization": "Bearer ${CRM_TOKEN}"}},
        "old": {"url": "http://127.0.0.1:9/sse?key=${OLD_KEY}", "transport": "sse"},
        "named": {"url": "https://x.example/mcp", "transport": "http"},
        "local": {"command": "${PYTHON}", "args": ["-m", "x"]},
    })
    config = load_config(path, {"CRM_TOKEN": TOKEN, "OLD_KEY": "k-77", "PYTHON": "/usr/bin/python3"})
    assert config["crm"]["transport"] == "streamable_http"
    assert config["crm"]["headers"] == {"Authorization": f"Bearer {TOKEN}"}
    assert config["crm"]["secrets"] == Secrets((TOKEN,))
    assert config["old"]["transport"] == "sse" and config["old"]["url"].endswith("key=k-77")
    assert config["named"]["transport"] == "streamable_http" and config["named"]["secrets"] == Secrets(())
    assert config["local"]["command"] == "/usr/bin/python3" and "secrets" not in config["local"]


def test_a_missing_variable_is_an_error_naming_it_and_its_server(tmp_path: Path) -> None:
    path = _write(tmp_path, {"crm": {"url": "https://crm.example/mcp",
                                     "headers": {"Authorization": "Bearer ${CRM_TOKEN}"}}})
    with pytest.raises(McpConfigError, match=r"server 'crm' uses \$\{CRM_TOKEN\}, and CRM_TOKEN is not set"):
        load_config(path, {})


@pytest.mark.parametrize(("spec", "says"), [
    ({"url": "ftp://x/mcp"}, "url must start with http"),
    ({"url": "https://x/mcp", "transport": "websocket"}, "transport must be one of"),
    ({"url": "https://x/mcp", "command": "x"}, "a command or a url"),
    ({"args": []}, "a command or a url"),
])
def test_a_bad_remote_entry_says_what_is_wrong(tmp_path: Path, spec: dict[str, object], says: str) -> None:
    with pytest.raises(McpConfigError, match=says):
        load_config(_write(tmp_path, {"crm": spec}), {})


def test_a_servers_secret_never_reaches_its_status_or_an_error(tmp_path: Path) -> None:
    path = _write(tmp_path, {"crm": {"url": "https://crm.example/mcp?key=${CRM_TOKEN}"}})
    server = McpServer("crm", load_config(path, {"CRM_TOKEN": TOKEN})["crm"], start_timeout=1, call_timeout=1)
    failure = ExceptionGroup("task group", [ConnectionError(f"cannot reach https://crm.example/mcp?key={TOKEN}")])
    described = server._described(failure)
    assert TOKEN not in described and described == f"ConnectionError: cannot reach https://crm.example/mcp?key={REDACTED}"
