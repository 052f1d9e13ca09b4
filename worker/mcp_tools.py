"""Tools from MCP servers, over sessions that live as long as the worker.

Servers come from ``CONFIG_DIR/mcp.json`` (``{"mcpServers": {name: {command,
args, env}}}``); each tool is offered to the model as ``<server>__<tool>``.

Opening a stdio session costs ~0.7 s and a call on an open one ~7 ms, so each
server's session is opened once, in a task of its own (anyio requires a
session to be closed by the task that opened it), and reopened after it breaks.
A server that cannot start costs only its own tools; a call that fails or
times out comes back to the model as a tool error.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog
from langchain_core.tools import BaseTool, StructuredTool, ToolException
from mcp import ClientSession
from mcp.types import CallToolResult, TextContent

from shared.metrics import TOOL_CALL
from worker.mcp_stdio import open_stdio_session
from worker.metrics import timed

log = structlog.get_logger(__name__)

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class McpConfigError(ValueError):
    pass


def load_config(path: Path, variables: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """Read ``mcp.json``; ``${VAR}`` in args and env values are expanded from ``variables``."""
    if not path.exists():
        return {}
    try:
        raw = json.loads(path.read_text())
        servers = raw["mcpServers"]
    except (ValueError, KeyError, TypeError) as exc:
        raise McpConfigError(f"{path}: expected {{\"mcpServers\": {{...}}}} ({exc})") from exc

    def expand(value: str) -> str:
        return _VAR.sub(lambda m: variables.get(m.group(1), m.group(0)), value)

    config: dict[str, dict[str, Any]] = {}
    for name, spec in servers.items():
        if "__" in name or not isinstance(spec, dict) or "command" not in spec:
            raise McpConfigError(f"{path}: server {name!r} needs a command and a name without '__'")
        config[name] = {
            "transport": "stdio",
            "command": expand(spec["command"]),
            "args": [expand(str(a)) for a in spec.get("args", [])],
            "env": {k: expand(str(v)) for k, v in spec.get("env", {}).items()} or None,
        }
        if spec.get("cwd"):
            config[name]["cwd"] = expand(spec["cwd"])
    return config


class ApprovalPolicy:
    """Which tools need the user's approval before they run (``requireApproval`` per server).

    ``true`` covers every tool of the server; a list names some of them, without the
    ``server__`` prefix. Nothing needs approval unless configured.
    """

    def __init__(self, whole_servers: frozenset[str] = frozenset(), tools: frozenset[str] = frozenset()):
        self.whole_servers = whole_servers
        self.tools = tools

    def __call__(self, tool: str) -> bool:
        server, sep, _ = tool.partition("__")
        return tool in self.tools or (bool(sep) and server in self.whole_servers)


def load_approvals(path: Path) -> ApprovalPolicy:
    """The ``requireApproval`` entries of ``mcp.json`` (read after :func:`load_config` accepted it)."""
    if not path.exists():
        return ApprovalPolicy()
    servers = json.loads(path.read_text())["mcpServers"]
    whole: set[str] = set()
    tools: set[str] = set()
    for name, spec in servers.items():
        required = spec.get("requireApproval", False)
        if required is True:
            whole.add(name)
        elif isinstance(required, list) and all(isinstance(t, str) and t for t in required):
            tools.update(f"{name}__{t}" for t in required)
        elif required is not False:
            raise McpConfigError(
                f"{path}: server {name!r}: requireApproval must be true, false or a list of tool names"
            )
    return ApprovalPolicy(frozenset(whole), frozenset(tools))


def _result_text(result: CallToolResult) -> str:
    parts: list[str] = []
    for item in result.content:
        if isinstance(item, TextContent):
            parts.append(item.text)
        else:
            parts.append(json.dumps(item.model_dump(mode="json")))
    if not parts and result.structuredContent is not None:
        parts.append(json.dumps(result.structuredContent))
    return "\n".join(parts)


class McpServer:
    """One MCP server: its session's lifetime, its tools, and calls to them."""

    def __init__(self, name: str, connection: dict[str, Any], *, start_timeout: float, call_timeout: float):
        self.name = name
        self.connection = connection
        self.start_timeout = start_timeout
        self.call_timeout = call_timeout
        self.session: ClientSession | None = None
        self.error: str | None = None
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._reopen = asyncio.Lock()
        self._background: set[asyncio.Task[None]] = set()

    @property
    def up(self) -> bool:
        return self.session is not None

    async def _hold_session(self, ready: asyncio.Event, stop: asyncio.Event) -> None:
        # ``ready`` and ``stop`` are this session's own: a session being torn down late
        # must not wake or clear the one opened after it.
        held: ClientSession | None = None
        try:
            # Its stderr goes to our log as events (worker/mcp_stdio.py).
            async with open_stdio_session(self.name, self.connection) as session:
                await session.initialize()
                self.session = held = session
                self.error = None
                ready.set()
                await stop.wait()
        except Exception as exc:  # the server's own failure: it costs only its tools
            self.error = f"{type(exc).__name__}: {exc}"
            log.warning("mcp.session_failed", server=self.name, error=self.error)
        finally:
            if held is not None and self.session is held:
                self.session = None
            ready.set()

    async def open(self) -> bool:
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self._hold_session(self._ready, self._stop), name=f"mcp:{self.name}")
        try:
            await asyncio.wait_for(self._ready.wait(), self.start_timeout)
        except TimeoutError:
            self.error = f"did not start within {self.start_timeout:g}s"
            log.warning("mcp.start_timeout", server=self.name)
            await self.close()
        return self.up

    async def close(self) -> None:
        self._stop.set()
        task, self._task = self._task, None
        if task is not None:
            try:
                await asyncio.wait_for(task, 5)
            except (TimeoutError, asyncio.CancelledError):
                task.cancel()
        self.session = None

    async def reopen(self, broken: ClientSession | None = None) -> None:
        """Replace ``broken`` (or a missing session) by a new one, once however many ask."""
        async with self._reopen:
            if self.session is not None and self.session is not broken:
                return  # someone else reopened it while we waited
            await self.close()
            if await self.open():
                log.info("mcp.session_reopened", server=self.name)

    def _discard(self, broken: ClientSession, why: str) -> None:
        """Stop using a session that failed a call; the next call waits for a new one."""
        if self.session is broken:
            self.session = None
            self.error = f"{why}; reopening"
        task = asyncio.create_task(self.reopen(broken))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def list_tools(self) -> list[BaseTool]:
        if self.session is None:
            return []
        listing = await asyncio.wait_for(self.session.list_tools(), self.call_timeout)
        return [self._wrap(t.name, t.description or "", t.inputSchema) for t in listing.tools]

    def _wrap(self, tool_name: str, description: str, schema: dict[str, Any]) -> BaseTool:
        async def call(**arguments: Any) -> str:
            return await self.call(tool_name, arguments)

        return StructuredTool(
            name=f"{self.name}__{tool_name}",
            description=description,
            args_schema=schema,
            coroutine=call,
        )

    async def call(self, tool_name: str, arguments: dict[str, Any]) -> str:
        session = self.session
        if session is None:
            await self.reopen()
            session = self.session
            if session is None:
                raise ToolException(f"tool server {self.name!r} is not available: {self.error}")
        try:
            with timed(TOOL_CALL, {"tool": f"{self.name}__{tool_name}"}):
                result = await asyncio.wait_for(session.call_tool(tool_name, arguments), self.call_timeout)
        except TimeoutError:
            # A hung server: answer the model now, and start afresh for the next call.
            message = f"tool {self.name}__{tool_name} did not answer within {self.call_timeout:g}s"
            self._discard(session, message)
            raise ToolException(message) from None
        except Exception as exc:
            # Most likely the server died (its pipe closed): it is started again.
            message = f"tool server {self.name!r} failed: {type(exc).__name__}: {exc}"
            self._discard(session, message)
            raise ToolException(message) from exc
        text = _result_text(result)
        if result.isError:
            raise ToolException(text or f"tool {self.name}__{tool_name} failed")
        return text


class McpToolbox:
    """All configured servers; owned by the worker for its whole life."""

    def __init__(self, servers: list[McpServer]) -> None:
        self.servers = servers
        self.tools: list[BaseTool] = []

    @classmethod
    def from_config(
        cls, config: dict[str, dict[str, Any]], *, start_timeout: float, call_timeout: float
    ) -> McpToolbox:
        return cls([
            McpServer(name, conn, start_timeout=start_timeout, call_timeout=call_timeout)
            for name, conn in config.items()
        ])

    async def open(self) -> None:
        await asyncio.gather(*(s.open() for s in self.servers))
        tools: list[BaseTool] = []
        for server in self.servers:
            try:
                tools.extend(await server.list_tools())
            except Exception as exc:
                server.error = f"listing tools failed: {exc}"
                log.warning("mcp.list_tools_failed", server=server.name, error=str(exc))
        self.tools = tools
        log.info(
            "mcp.ready",
            servers={s.name: ("up" if s.up else s.error) for s in self.servers},
            tools=[t.name for t in tools],
        )

    async def close(self) -> None:
        await asyncio.gather(*(s.close() for s in self.servers), return_exceptions=True)

    def status(self) -> dict[str, str]:
        return {s.name: "up" if s.up else (s.error or "down") for s in self.servers}
