"""A tiny MCP server over stdio for tests: ``python tests/fakes/tools_server.py``.

Tools: ``echo``, ``add``, ``slow`` (sleeps, so a worker can be killed mid-tool) and
``fail`` (raises, so the client gets an MCP tool error). None acts on anything, and each says so
with the MCP annotation ``readOnlyHint``: a call that may have run when its worker died is sent
again without asking (worker/tools/ledger/). A test that needs a call the worker must ask about sets
``"safeToRepeat": false`` on the server in its mcp.json (tests/support/env.py ``not_safe_to_repeat``).

Every call appends one JSON line ``{"tool", "args", "pid", "key"}`` to the file named by
``TOOLS_LOG`` (when set) *before* doing its work (``key``: the idempotency key the
worker sent in the request's ``_meta``, ``"sophos/idempotency-key"``, or null), so tests can count executions
across worker restarts; ``slow`` appends ``{"tool": "slow", "event": "done"}``
when it finishes. Lines are short single writes in append mode, so lines from
several server processes do not interleave.

Like the real memory server, it says on stderr that it runs (``STARTED_LINE``): the
worker must log that as an event, not pass it on raw.

``--http PORT`` serves the same tools as a remote server over Streamable HTTP on 127.0.0.1
(``/mcp``; with ``--sse``, over the older HTTP+SSE transport at ``/sse``), in a process of its own
that outlives any worker: every request must carry
``Authorization: Bearer <TOOLS_TOKEN>`` (401 otherwise), and the log lines say ``"remote": true``.
``vanish`` ends the server's process in the middle of the call (a server that dies mid-call).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from mcp.server.fastmcp import Context, FastMCP
from mcp.types import ToolAnnotations

STARTED_LINE = "Tools MCP Server running on stdio"

# WARNING: FastMCP logs every request at INFO on stderr, which would flood the worker log.
mcp = FastMCP("tools", log_level="WARNING")
READ_ONLY = ToolAnnotations(readOnlyHint=True)


def _log(entry: dict[str, Any]) -> None:
    path = os.environ.get("TOOLS_LOG")
    if not path:
        return
    line = json.dumps(entry, ensure_ascii=False) + "\n"
    # One os.write on an O_APPEND descriptor: atomic for a line this size, and
    # on disk (page cache) before the tool does anything, even if we are killed.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def idempotency_key(ctx: Context[Any, Any, Any]) -> str | None:
    """The key Sophos sends with every call, the same on each attempt of one call (its ``_meta``)."""
    meta = ctx.request_context.meta
    return (meta.model_extra or {}).get("sophos/idempotency-key") if meta is not None else None


REMOTE = "--http" in sys.argv
SSE = "--sse" in sys.argv


def _called(tool: str, ctx: Context[Any, Any, Any], **args: Any) -> None:
    _log({"tool": tool, "args": args, "pid": os.getpid(), "key": idempotency_key(ctx),
          **({"remote": True} if REMOTE else {})})


@mcp.tool(annotations=READ_ONLY)
def echo(text: str, ctx: Context[Any, Any, Any]) -> str:
    """Return the text unchanged."""
    _called("echo", ctx, text=text)
    return text


@mcp.tool(annotations=READ_ONLY)
def add(a: int, b: int, ctx: Context[Any, Any, Any]) -> int:
    """Add two integers."""
    _called("add", ctx, a=a, b=b)
    return a + b


@mcp.tool(annotations=READ_ONLY)
async def slow(seconds: float, ctx: Context[Any, Any, Any]) -> str:
    """Sleep for the given number of seconds, then say so."""
    _called("slow", ctx, seconds=seconds)
    await asyncio.sleep(seconds)
    _log({"tool": "slow", "event": "done", "pid": os.getpid()})
    return f"slept {seconds}s"


@mcp.tool(annotations=READ_ONLY)
def fail(message: str, ctx: Context[Any, Any, Any]) -> str:
    """Always fail with the given message."""
    _called("fail", ctx, message=message)
    raise RuntimeError(message)


@mcp.tool(annotations=READ_ONLY)
def vanish(ctx: Context[Any, Any, Any]) -> str:
    """End this server's process in the middle of the call."""
    _called("vanish", ctx)
    os._exit(3)


def serve_http(port: int) -> None:
    """The tools over Streamable HTTP on loopback, behind the bearer token ``TOOLS_TOKEN``."""
    import uvicorn

    expected = f"Bearer {os.environ['TOOLS_TOKEN']}".encode()
    app = mcp.sse_app() if SSE else mcp.streamable_http_app()

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != expected:
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b"unauthorized"})
            return
        await app(scope, receive, send)

    path = "/sse" if SSE else "/mcp"
    print(f"{STARTED_LINE.removesuffix('stdio')}http://127.0.0.1:{port}{path}", file=sys.stderr, flush=True)
    uvicorn.run(guarded, host="127.0.0.1", port=port, log_level="warning", lifespan="on")


if __name__ == "__main__":
    if REMOTE:
        serve_http(int(sys.argv[sys.argv.index("--http") + 1]))
    else:
        print(STARTED_LINE, file=sys.stderr, flush=True)
        mcp.run("stdio")
