"""An MCP server over stdio that fails on request: ``python tests/fakes/fragile_server.py``.

Tools: ``ping`` (answers with its process id, so a test can tell a reopened
session from the first one), ``die`` (the process exits in the middle of the call,
as a crashing server would) and ``hang`` (never answers). Each call appends
``{"tool", "args", "pid"}`` to ``TOOLS_LOG`` first, like tests/fakes/tools_server.py.
"""

from __future__ import annotations

import asyncio
import json
import os

from mcp.server.fastmcp import FastMCP

mcp = FastMCP("fragile", log_level="WARNING")


def _called(tool: str) -> None:
    path = os.environ.get("TOOLS_LOG")
    if path:
        line = json.dumps({"tool": f"fragile.{tool}", "args": {}, "pid": os.getpid()}) + "\n"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


@mcp.tool()
def ping() -> str:
    """Answer with this server's process id."""
    _called("ping")
    return f"pong from {os.getpid()}"


@mcp.tool()
def die() -> str:
    """Exit the server process in the middle of the call."""
    _called("die")
    os._exit(3)


@mcp.tool()
async def hang() -> str:
    """Never answer."""
    _called("hang")
    await asyncio.Event().wait()
    return "unreachable"


if __name__ == "__main__":
    mcp.run("stdio")
