"""A tool server that is down when the worker starts is offered once it comes up.

Real worker and API; the late server is the fake tools server behind a gate: it exits at
once while a flag file exists, as a server whose dependency is not there yet would. The
worker must not keep the tool list it found at start-up for its whole life.
"""

from __future__ import annotations

import sys

import pytest

from tests.fakes.ollama import FakeOllama, Text, ToolCalls
from tests.support.client import chat, get_json, read_sse, tool_calls, wait_for
from tests.support.env import TOOLS_SERVER, SophosEnv, mcp_servers

pytestmark = pytest.mark.fault

#: ``python -c GATE FLAG SERVER``: exit while FLAG exists, else run SERVER as a script.
GATE = (
    "import os, runpy, sys\n"
    "if os.path.exists(sys.argv[1]):\n"
    "    sys.exit(3)\n"
    "sys.argv = sys.argv[2:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)


def offered(request: dict[str, object]) -> set[str]:
    """The tool names a model request offers."""
    return {t["function"]["name"] for t in request.get("tools", [])}  # type: ignore[attr-defined]


def test_a_tool_server_down_at_start_is_offered_once_it_starts(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    closed = sophos_env.root / "late-server-closed"
    closed.touch()
    tools = mcp_servers(sophos_env.tools_log, sophos_env.root)["mcpServers"]["tools"]
    sophos_env.write_mcp_config({"mcpServers": {
        "tools": tools,
        "late": {
            "command": sys.executable,
            "args": ["-c", GATE, str(closed), str(TOOLS_SERVER)],
            "env": {"TOOLS_LOG": str(sophos_env.tools_log)},
        },
    }})
    start_worker(sophos_env)
    api = start_api(sophos_env).url
    servers = get_json(api, "/api/readyz", expect=200)["checks"]["toolServers"]
    assert servers["tools"] == "up" and servers["late"] != "up"

    model.script(Text("nothing late yet"))
    conversation, _ = chat(api, "which tools?")
    assert read_sse(api, conversation)[-1].data["status"] == "completed"
    names = offered(model.requests[-1])
    assert "tools__echo" in names and not any(n.startswith("late__") for n in names)

    # The server can start now: the worker's retries find it, with no restart.
    closed.unlink()
    wait_for(
        lambda: get_json(api, "/api/readyz")["checks"]["toolServers"]["late"] == "up",
        60, interval=0.5, message="the late server to be up",
    )
    asked = len(model.requests)
    model.script(ToolCalls([("late__echo", {"text": "back again"})]), Text("it answered"))
    chat(api, "and now?", conversation)
    assert read_sse(api, conversation)[-1].data["status"] == "completed"
    names = offered(model.requests[asked])
    assert {"late__echo", "late__add", "tools__echo"} <= names
    detail = get_json(api, f"/api/conversations/{conversation}")
    results = [(m["name"], m.get("status", ""), m["content"])
               for m in detail["messages"] if m["role"] == "tool"]
    assert results == [("late__echo", "success", "back again")]
    assert [c["args"] for c in tool_calls(sophos_env.tools_log, "echo")] == [{"text": "back again"}]
