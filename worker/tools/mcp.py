"""Tools from MCP servers, over sessions that live as long as the worker.

Servers come from ``CONFIG_DIR/mcp.json`` (worker/tools/config.py): a command run as a stdio
child, or a URL reached over Streamable HTTP or SSE (worker/tools/remote.py); each tool is offered
to the model as ``<server>__<tool>``. A remote server's secrets (the values of ``${VAR}`` in its
URL and headers) are taken out of everything written about it: its status, logs, tool errors.

Opening a stdio session costs ~0.7 s and a call on an open one ~7 ms, so each
server's session is opened once, in a task of its own (anyio requires a
session to be closed by the task that opened it), and reopened after it breaks.
A server that cannot start costs only its own tools. A call that was sent and got no answer (it
timed out, or the transport was lost: the pipe closed, the connection was reset) may have acted:
the ledger is told (:func:`worker.tools.ledger.attempt.unanswered`) and treats it like a call cut by a
crash. A call that never left (no session) or that the server answered with an error is an error
the model gets.

The tools offered are never frozen at start-up: a server that is down or slower
than ``MCP_START_TIMEOUT`` is tried again in the background, with a growing pause
(:data:`RETRY_FIRST` doubling up to :data:`RETRY_MAX`), each try waiting as long as
the pause before it, so a slow starter gets there too. Each session lists its
tools when it opens; :meth:`McpToolbox.current` is read before every model call
(worker/agent/graph.py) and returns the same tuple until a listing changes it, so the
model is bound again only then.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import anyio
import structlog
from langchain_core.tools import BaseTool, StructuredTool, ToolException
from mcp import ClientSession
from mcp.shared.exceptions import McpError
from mcp.types import CONNECTION_CLOSED, CallToolResult, TextContent, Tool

from shared import tracing
from shared.redis.metrics import TOOL_CALL
from worker.metrics import timed
from worker.tools.config import load_config, secrets_of
from worker.tools.ledger.attempt import request_meta, task_state, unanswered
from worker.tools.policy import NEEDS_APPROVAL, SAFE_TO_REPEAT, ApprovalPolicy, RepeatPolicy, needs_approval
from worker.tools.remote import open_remote_session
from worker.tools.stdio import open_stdio_session
from worker.tools.tasks import ASK_TASK, TaskLost, call_as_task, resume_task, task_capable

#: the code of mcp's error for a request a Streamable HTTP server refused with 404 (its session is
#: gone: the server restarted); mcp 1.30 sends it from ``_send_session_terminated_error``
SESSION_TERMINATED = 32600

__all__ = ["RETRY_FIRST", "RETRY_MAX", "McpServer", "McpToolbox", "load_config"]

log = structlog.get_logger(__name__)

#: The first pause before a server that could not start is tried again, in seconds.
RETRY_FIRST = 1.0
#: The longest pause between two tries (each pause doubles the one before).
RETRY_MAX = 60.0

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

    def __init__(
        self, name: str, connection: dict[str, Any], *, start_timeout: float, call_timeout: float,
        repeat: RepeatPolicy | None = None, approvals: ApprovalPolicy | None = None,
    ):
        self.name = name
        self.connection = connection
        self.secrets = secrets_of(connection)
        self.repeat = repeat or RepeatPolicy()
        self.approvals = approvals or ApprovalPolicy()
        self.start_timeout = start_timeout
        self.call_timeout = call_timeout
        self.session: ClientSession | None = None
        self.error: str | None = None
        #: The tools of the last session that opened (kept while it is reopened).
        self.tools: tuple[BaseTool, ...] = ()
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._reopen = asyncio.Lock()
        self._background: set[asyncio.Task[None]] = set()
        self._retry: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def up(self) -> bool:
        return self.session is not None

    async def _hold_session(self, ready: asyncio.Event, stop: asyncio.Event) -> None:
        # ``ready`` and ``stop`` are this session's own: a session being torn down late
        # must not wake or clear the one opened after it.
        held: ClientSession | None = None
        try:
            async with self._open_session() as session:
                await session.initialize()
                # Listed before the session is offered: a server that is up has its tools.
                listing = await asyncio.wait_for(session.list_tools(), self.call_timeout)
                tools = tuple(self._wrap(t, task=task_capable(session, t)) for t in listing.tools)
                if [t.name for t in tools] != [t.name for t in self.tools]:
                    log.info("mcp.tools_listed", server=self.name, tools=[t.name for t in tools])
                self.tools = tools
                self.session = held = session
                self.error = None
                ready.set()
                await stop.wait()
        except Exception as exc:  # the server's own failure: it costs only its tools
            self.error = self._described(exc)
            log.warning("mcp.session_failed", server=self.name, error=self.error)
        finally:
            if held is not None and self.session is held:
                self.session = None
            ready.set()

    @asynccontextmanager
    async def _open_session(self) -> AsyncIterator[ClientSession]:
        if self.connection["transport"] == "stdio":
            # Its stderr goes to our log as events (worker/tools/stdio.py).
            async with open_stdio_session(self.name, self.connection) as session:
                yield session
        else:
            async with open_remote_session(self.connection, call_timeout=self.call_timeout) as session:
                yield session

    def _described(self, exc: BaseException) -> str:
        """``exc`` as the server's status or a tool error may say it: its secrets taken out. An
        exception group (anyio's task groups raise them) is told by its first leaf."""
        while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]
        return self.secrets.redact(f"{type(exc).__name__}: {exc}")

    async def open(self, wait: float | None = None) -> bool:
        """Start a session; wait for it up to ``wait`` seconds (``MCP_START_TIMEOUT`` by default).

        A server not up by then is tried again in the background until it is.
        """
        timeout = self.start_timeout if wait is None else wait
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self._hold_session(self._ready, self._stop), name=f"mcp:{self.name}")
        try:
            await asyncio.wait_for(self._ready.wait(), timeout)
        except TimeoutError:
            self.error = f"did not start within {timeout:g}s"
            log.warning("mcp.start_timeout", server=self.name, timeout=timeout)
            await self.close()
        if not self.up:
            self._retry_later()
        return self.up

    def _retry_later(self) -> None:
        if self._closed or (self._retry is not None and not self._retry.done()):
            return  # stopping, or the retrying task is the one that failed
        self._retry = asyncio.create_task(self._retry_until_up(), name=f"mcp-retry:{self.name}")

    async def _retry_until_up(self) -> None:
        pause = RETRY_FIRST
        while not self.up and not self._closed:
            log.info("mcp.retry_scheduled", server=self.name, seconds=pause, error=self.error)
            await asyncio.sleep(pause)
            # As long as the pause: a server slower than MCP_START_TIMEOUT gets there in the end.
            await self.reopen(wait=max(self.start_timeout, pause))
            pause = min(pause * 2, RETRY_MAX)

    async def close(self) -> None:
        self._stop.set()
        task, self._task = self._task, None
        if task is not None:
            try:
                await asyncio.wait_for(task, 5)
            except (TimeoutError, asyncio.CancelledError):
                task.cancel()
        self.session = None

    async def shutdown(self) -> None:
        """Close the session for good: no retry after this."""
        self._closed = True
        retry, self._retry = self._retry, None
        if retry is not None:
            retry.cancel()
            with suppress(asyncio.CancelledError):
                await retry
        await self.close()

    async def reopen(self, broken: ClientSession | None = None, *, wait: float | None = None) -> None:
        """Replace ``broken`` (or a missing session) by a new one, once however many ask."""
        async with self._reopen:
            if self._closed or (self.session is not None and self.session is not broken):
                return  # stopping, or someone else reopened it while we waited
            await self.close()
            if await self.open(wait):
                log.info("mcp.session_reopened", server=self.name, tools=len(self.tools))

    def _discard(self, broken: ClientSession, why: str) -> None:
        """Stop using a session that failed a call; the next call waits for a new one."""
        if self.session is broken:
            self.session = None
            self.error = f"{why}; reopening"
        task = asyncio.create_task(self.reopen(broken))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _wrap(self, listed: Tool, *, task: bool = False) -> BaseTool:
        tool_name = listed.name

        async def call(**arguments: Any) -> str:
            return await self.call(tool_name, arguments, task=task)

        async def ask(task_id: str) -> str:
            return await self.ask_task(tool_name, task_id)

        hints = listed.annotations
        hinted = hints is not None and bool(hints.readOnlyHint or hints.idempotentHint)
        # Only a tool that says so is destructive: MCP's default (true) would ask about every
        # tool that says nothing, the memory server's among them (worker/tools/policy.py).
        destructive = hints is not None and hints.destructiveHint is True and not hints.readOnlyHint
        return StructuredTool(
            name=f"{self.name}__{tool_name}",
            description=listed.description or "",
            args_schema=listed.inputSchema,
            coroutine=call,
            metadata={
                SAFE_TO_REPEAT: self.repeat(self.name, tool_name, hinted=hinted),
                NEEDS_APPROVAL: self.approvals.for_tool(self.name, tool_name, destructive=destructive),
                **({ASK_TASK: ask} if task else {}),
            },
        )

    async def call(self, tool_name: str, arguments: dict[str, Any], *, task: bool = False) -> str:
        """Call the tool (as an MCP task when ``task``: worker/tools/tasks.py); its text, or a
        ``ToolException`` for the model."""
        tracing.annotate({"sophos.tool.server": self.name,  # on the call's span (the ledger: calls.py)
                          "sophos.tool.transport": self.connection["transport"], "sophos.tool.task": task})
        full = f"{self.name}__{tool_name}"
        for last in (False, True):
            session = await self._session_for_call()
            try:
                with timed(TOOL_CALL, {"tool": full}):
                    # ``_meta`` carries the call's idempotency key (worker/tools/ledger/):
                    # langchain-mcp-adapters 0.3 does not forward ``_meta`` (its issue #410), so the
                    # session is called directly.
                    if task:  # each request within the call timeout; the task as long as it works
                        result = await call_as_task(session, tool_name, arguments, meta=request_meta(),
                                                    on_state=task_state, request_timeout=self.call_timeout)
                    else:
                        request = session.call_tool(tool_name, arguments, meta=request_meta())
                        result = await asyncio.wait_for(request, self.call_timeout)
            except TaskLost as exc:
                # The task was made: it may be working still. Asked for again on the next attempt.
                raise self._unanswered(session, self.secrets.redact(f"tool {full}: {exc}")) from None
            except McpError as exc:
                if exc.error.code == SESSION_TERMINATED and not last:
                    # A remote server restarted since the session opened: it refused the request
                    # (404 for an unknown session), which never ran. Once more, on a new session.
                    self._discard(session, "the server no longer knows the session")
                    continue
                if exc.error.code != CONNECTION_CLOSED:  # the server's answer: an outcome
                    answer = self.secrets.redact(f"tool {full} failed: {exc.error.message}")
                    raise ToolException(answer) from None
                # The pipe closed or the connection was lost while the call was out: the server
                # died mid-call. It may have acted.
                why = f"tool server {self.name!r} went away during the call"
                raise self._unanswered(session, why) from None
            except TimeoutError:
                # A hung server, or one that died with the answer's stream (mcp's HTTP client drops a
                # cut stream silently): it may be acting still. Start afresh for the next call.
                why = f"tool {full} did not answer within {self.call_timeout:g}s"
                raise self._unanswered(session, why) from None
            except (anyio.ClosedResourceError, anyio.BrokenResourceError) as exc:
                # The session's own stream to its transport was closed: the request never left us.
                message = f"tool server {self.name!r} is not available: {self._described(exc)}"
                self._discard(session, message)
                raise ToolException(message) from None
            except Exception as exc:
                # The transport failed while the call was out (an HTTP error, a reset): it may have acted.
                raise self._unanswered(
                    session, f"tool server {self.name!r} failed during the call: {self._described(exc)}"
                ) from None
            return self._answer(full, result)
        raise AssertionError("unreachable: the last try returns or raises")

    def _answer(self, full: str, result: CallToolResult) -> str:
        text = _result_text(result)
        if result.isError:
            raise ToolException(self.secrets.redact(text) or f"tool {full} failed")
        return text

    async def ask_task(self, tool_name: str, task_id: str) -> str:
        """The result of the call of ``tool_name`` made as the task ``task_id`` before a crash, from
        its server (waited for while it works): its text, or a ``ToolException`` (the task failed or
        was cancelled). Raises :class:`~worker.tools.tasks.TaskForgotten` if the server does not know
        it; any other failure means it could not be asked."""
        session = await self._session_for_call()
        full = f"{self.name}__{tool_name}"
        with timed(TOOL_CALL, {"tool": full}):
            result = await resume_task(session, task_id, on_state=task_state,
                                       request_timeout=self.call_timeout)
        return self._answer(full, result)

    async def _session_for_call(self) -> ClientSession:
        session = self.session
        if session is None:
            await self.reopen()
            session = self.session
            if session is None:  # never sent: an error the model may act on
                raise ToolException(f"tool server {self.name!r} is not available: {self.error}")
        return session

    def _unanswered(self, session: ClientSession, message: str) -> ToolException:
        """A call sent and never answered: the session is replaced, the ledger told (it may have
        acted), and the error for the model without a ledger (tests of the graph alone)."""
        self._discard(session, message)
        unanswered(message)
        return ToolException(message)


class McpToolbox:
    """All configured servers; owned by the worker for its whole life."""

    def __init__(self, servers: list[McpServer], approvals: ApprovalPolicy | None = None) -> None:
        self.servers = servers
        self.approvals = approvals or ApprovalPolicy()
        self._listings: tuple[tuple[BaseTool, ...], ...] = ()
        self._tools: tuple[BaseTool, ...] = ()

    @classmethod
    def from_config(
        cls, config: dict[str, dict[str, Any]], *, start_timeout: float, call_timeout: float,
        repeat: RepeatPolicy | None = None, approvals: ApprovalPolicy | None = None,
    ) -> McpToolbox:
        return cls([
            McpServer(name, conn, start_timeout=start_timeout, call_timeout=call_timeout, repeat=repeat,
                      approvals=approvals)
            for name, conn in config.items()
        ], approvals)

    async def open(self) -> None:
        """Start every server, waiting up to ``MCP_START_TIMEOUT``; the others keep trying."""
        await asyncio.gather(*(s.open() for s in self.servers))
        log.info(
            "mcp.ready",
            servers={s.name: ("up" if s.up else s.error) for s in self.servers},
            tools=[t.name for t in self.current()],
        )

    def current(self) -> tuple[BaseTool, ...]:
        """Every server's tools now; the same tuple as last time unless a listing changed.

        Called before each model call: a comparison of a few tuples by identity.
        """
        listings = tuple(s.tools for s in self.servers)
        if len(listings) != len(self._listings) or any(
            a is not b for a, b in zip(listings, self._listings, strict=True)
        ):
            self._listings = listings
            self._tools = tuple(t for listing in listings for t in listing)
        return self._tools

    def needs_approval(self, name: str) -> bool:
        """Whether a call of the tool the model calls ``name`` waits for the user's approval: as the
        tool offered now says (worker/tools/policy.py); for one not offered now, as configured."""
        tool = next((t for t in self.current() if t.name == name), None)
        if tool is not None:
            return needs_approval(tool)
        return self.approvals(name)

    @property
    def tools(self) -> list[BaseTool]:
        return list(self.current())

    async def close(self) -> None:
        await asyncio.gather(*(s.shutdown() for s in self.servers), return_exceptions=True)

    def status(self) -> dict[str, str]:
        return {s.name: "up" if s.up else (s.error or "down") for s in self.servers}
