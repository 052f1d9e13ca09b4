"""The fake tools server's tools (tests/fakes/tools_server.py) on the mcp package's FastMCP: what it
serves over HTTP, and the reference its own stdio server is held to (tests/test_fakes.py)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from mcp.server.fastmcp import Context, FastMCP
from mcp.types import ToolAnnotations


def build(tools: ModuleType) -> FastMCP:
    """FastMCP serving ``tools``' functions (tests/fakes/tools_server.py, passed in: it runs as a
    script, so it is not importable under one name)."""
    # WARNING: FastMCP logs every request at INFO on stderr, which would flood the worker log.
    server = FastMCP("tools", log_level="WARNING")
    read_only = ToolAnnotations(readOnlyHint=True)

    def key_of(ctx: Context[Any, Any, Any]) -> str | None:
        """The key Sophos sends with every call, the same on each attempt of one call (``_meta``)."""
        meta = ctx.request_context.meta
        return (meta.model_extra or {}).get(tools.KEY) if meta is not None else None

    @server.tool(annotations=read_only, description=tools.echo.__doc__)
    def echo(text: str, ctx: Context[Any, Any, Any]) -> str:
        return str(tools.echo(text, key_of(ctx)))

    @server.tool(annotations=read_only, description=tools.add.__doc__)
    def add(a: int, b: int, ctx: Context[Any, Any, Any]) -> int:
        return int(tools.add(a, b, key_of(ctx)))

    @server.tool(annotations=read_only, description=tools.slow.__doc__)
    async def slow(seconds: float, ctx: Context[Any, Any, Any]) -> str:
        return str(await tools.slow(seconds, key_of(ctx)))

    @server.tool(annotations=read_only, description=tools.fail.__doc__)
    def fail(message: str, ctx: Context[Any, Any, Any]) -> str:
        return str(tools.fail(message, key_of(ctx)))

    @server.tool(annotations=read_only, description=tools.vanish.__doc__)
    def vanish(ctx: Context[Any, Any, Any]) -> str:
        return str(tools.vanish(key_of(ctx)))

    return server
