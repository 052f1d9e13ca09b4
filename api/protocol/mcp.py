"""The agent as an MCP server at ``/mcp`` (Streamable HTTP), as the Agent Server offers it: an MCP
client (an IDE, a desktop assistant) lists the caller's assistants as tools and hands one a task
(docs/agent-protocol.md, "The agent as an MCP server").

- **Tools.** Each assistant the caller sees (``agent`` and their own; another user's is in no list
  and no call finds it) is a tool: named after the assistant, made to fit MCP's tool names
  (:func:`tool_names`), described by its description, taking a ``message`` and, to continue a
  thread, a ``thread_id``.
- **A call is a run like any other**, made by :meth:`ProtocolRuns.create`: on a new thread (as
  ``POST /runs`` with ``on_completion: keep``) or on the thread it names, after the submission
  rate limit the run routes' guard counts; the same checks, quota, queue, worker, owner and crash
  semantics. The call waits for the run's end and answers what it ended with (:func:`answer`).
- **A run cut by a crash** is answered as cut, resumable, with its thread: nothing is run again
  behind the caller's back (DESIGN.md, "Crash and restart semantics"); the caller resumes it by
  calling again with the ``thread_id`` and no ``message``. The call itself waits across the
  crash: the run ends (``interrupted``) when a worker comes back and finds it.
- **Who asks** is the HTTP request's caller: the mount sits behind the app's one guard
  (api/auth/guard.py), so a request without a valid credential is 401 before MCP reads it, and
  the caller it decided is bound again in the task that serves the call.
- **Stateless** (a transport per request, no session): any API process serves any request, and
  nothing of a call lives in a process but its wait.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import msgspec
import structlog
from litestar.types import Receive, Scope, Send
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from api.auth.identity import Caller, bind, unbind
from api.http.limits import SubmissionLimit, client_address
from api.protocol.answers import ended, protocol_runs_of
from api.protocol.assistants.service import Assistants, is_default
from api.protocol.runs.input import RunCreate
from api.protocol.runs.service import ProtocolRuns
from api.protocol.runs.stateless import create_on_new_thread
from api.protocol.threads.bodies import thread_id_of
from api.protocol.threads.state import values_with_interrupts
from api.resources import Resources
from api.runs.schemas import RunError
from shared.contracts.events import text_of
from shared.contracts.protocol import REFUSED_OVER_A_DECISION
from shared.contracts.runs import RunStatus
from shared.errors import BadRequest, NotFound, SophosError

log = structlog.get_logger(__name__)

#: MCP's tool names (the specification's 2025-11-25 rule): these characters, 1 to 128 of them
_NOT_IN_A_TOOL_NAME = re.compile(r"[^A-Za-z0-9_.-]+")
TOOL_NAME_MAX = 128
INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "message": {
            "type": "string",
            "description": "What to ask the assistant. Leave it out, with thread_id, to resume a "
            "thread whose run was cut short",
        },
        "thread_id": {
            "type": "string",
            "description": "A thread an earlier call answered from, to continue it; left out: a new thread",
        },
    },
    "additionalProperties": False,
}


def tool_names(assistants: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each assistant by its tool name: its name with every run of other characters made one
    ``_``; a name two assistants would share gets the assistant id's first 8 characters (the
    default, ``agent``, keeps its own)."""
    base = {a["assistant_id"]: _fit(str(a.get("name") or "")) for a in assistants}
    shared = Counter(base.values())
    named: dict[str, dict[str, Any]] = {}
    for a in assistants:
        name = base[a["assistant_id"]]
        if shared[name] > 1 and not is_default(a["assistant_id"]):
            name = f"{name[: TOOL_NAME_MAX - 9]}_{a['assistant_id'][:8]}"
        named[name] = a
    return named


def _fit(name: str) -> str:
    return _NOT_IN_A_TOOL_NAME.sub("_", name).strip("_")[:TOOL_NAME_MAX] or "assistant"


def arguments_of(arguments: dict[str, Any]) -> tuple[str | None, str | None]:
    """The call's message and thread id (parsed); BadRequest naming what is wrong."""
    unknown = sorted(set(arguments) - set(INPUT_SCHEMA["properties"]))
    if unknown:
        raise BadRequest(f"unknown arguments: {', '.join(unknown)} (a tool takes message and thread_id)")
    message, thread_id = arguments.get("message"), arguments.get("thread_id")
    if message is not None and (not isinstance(message, str) or not message.strip()):
        raise BadRequest("message must be a non-empty string")
    if thread_id is not None and not isinstance(thread_id, str):
        raise BadRequest("thread_id must be a string")
    if message is None and thread_id is None:
        raise BadRequest("message is required (without it, thread_id names a thread to resume)")
    return message, thread_id_of(thread_id) if thread_id is not None else None


def answer(
    tool: str, thread_id: str, run_id: str, status: RunStatus, error: tuple[str, str] | None,
    resumable: bool, values: dict[str, Any],
) -> types.CallToolResult:
    """What a call answers once its run ended (``error``: its code and message; ``values``: the
    thread's, with ``__interrupt__`` while it waits). Pure."""
    where = {"thread_id": thread_id, "run_id": run_id, "status": str(status)}
    messages = values.get("messages") or []
    last = messages[-1] if messages else {}
    final = text_of(last.get("content")) if last.get("type") == "ai" and not last.get("tool_calls") else None
    if status is RunStatus.WAITING and (error is None or error[0] != REFUSED_OVER_A_DECISION):
        asked = [
            r.get("name", "?") for i in values.get("__interrupt__") or []
            for r in (i.get("value") or {}).get("action_requests") or []
        ]
        return _result(
            f"Run {run_id} waits for approval of {', '.join(asked) or 'a tool call'} on thread "
            f"{thread_id}. Decide on the page, with `sophos approve`, or with the Agent Protocol's "
            "command.resume; the answer is then in the thread.", where,
        )
    if status is RunStatus.COMPLETED or (status is RunStatus.INTERRUPTED and not resumable and final):
        if final is not None:
            return _result(final, where)
        return _result(f"Run {run_id} on thread {thread_id} ended without an answer", where, error=True)
    if status is RunStatus.INTERRUPTED and resumable:
        return _result(
            f"Run {run_id} on thread {thread_id} was cut short (its worker stopped) before it answered. "
            f"Nothing is run again by itself: call {tool} again with thread_id {thread_id} and no "
            "message to resume it from its last step.", where, error=True,
        )
    if status is RunStatus.CANCELLED:
        return _result(f"Run {run_id} on thread {thread_id} was cancelled", where, error=True)
    if not status.finished:
        return _result(
            f"Run {run_id} on thread {thread_id} is still {status}: this server stopped waiting for "
            "it (it is shutting down); the run goes on", where, error=True,
        )
    code, message = error or ("INTERRUPTED", f"run {run_id} ended {status}")
    return _result(f"{code}: {message}", where, error=True)


def _result(text: str, where: dict[str, str], *, error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], structuredContent=where, isError=error
    )


def _refused(exc: SophosError) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=f"{exc.code}: {exc.message}")], isError=True
    )


class McpServer:
    """The MCP server and its Streamable HTTP session manager (stateless), made on the first
    request to ``/mcp`` by the mount (api/protocol/mcp_mount.py), which runs the manager."""

    def __init__(self, max_body_bytes: int) -> None:
        self.server: Server[Any, Any] = Server(
            "sophos",
            instructions="Each tool is one of your Sophos assistants: give it a message, get its "
            "answer. Every call is a durable run on a thread; pass the thread_id an answer names "
            "to continue that thread.",
        )
        self.server.list_tools()(self._list)
        # Input checked by arguments_of (naming the problem); the server's cache of tool
        # definitions is one for every caller, so it is no one's list of tools.
        self.server.call_tool(validate_input=False)(self._call)
        self.manager = StreamableHTTPSessionManager(
            self.server, stateless=True, max_request_body_size=max_body_bytes
        )

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.manager.handle_request(scope, receive, send)  # type: ignore[arg-type]

    def _scope(self) -> Scope:
        request = self.server.request_context.request
        if request is None:
            raise RuntimeError("an MCP request without its HTTP request")
        scope: Scope = request.scope
        return scope

    async def _tools(self) -> dict[str, dict[str, Any]]:
        resources: Resources = self._scope()["app"].state.resources
        return tool_names(await Assistants(resources.store, resources.redis).matching(None, None, None))

    async def _list(self) -> list[types.Tool]:
        with _as_caller(self._scope()):
            tools = await self._tools()
        return [
            types.Tool(
                name=name, title=str(a.get("name") or name), inputSchema=INPUT_SCHEMA,
                description=a.get("description") or f"The Sophos assistant {a.get('name') or name}",
            )
            for name, a in tools.items()
        ]

    async def _call(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        scope = self._scope()
        app = scope["app"]
        with _as_caller(scope):
            try:
                assistant = (await self._tools()).get(name)
                if assistant is None:
                    raise NotFound(f"tool {name[:128]!r} not found: tools/list names your assistants")
                message, thread_id = arguments_of(arguments)
                limit: SubmissionLimit = app.state.submission_limit
                await limit.hit(app.state.resources.redis, client_address(scope))
                said = None if message is None else {"messages": [{"role": "user", "content": message}]}
                body = RunCreate(assistant_id=assistant["assistant_id"], input=said)
                protocol_runs = protocol_runs_of(app.state)
                # A client that leaves stops its wait, never the creation (as runs.wait).
                with anyio.CancelScope(shield=True):
                    on, run_id = await _create(protocol_runs, body, thread_id)
                log.info("mcp.call", tool=name, conversation_id=on, run_id=run_id)
                return await _outcome(app.state.resources, protocol_runs, name, on, run_id)
            except SophosError as exc:
                log.info("mcp.call_refused", tool=name[:128], code=exc.code, error=exc.message)
                return _refused(exc)


async def _create(protocol_runs: ProtocolRuns, body: RunCreate, thread_id: str | None) -> tuple[str, str]:
    if thread_id is None:
        new_thread, run, _, _ = await create_on_new_thread(
            protocol_runs, msgspec.structs.replace(body, on_completion="keep")
        )
        return new_thread, run["run_id"]
    run, _ = await protocol_runs.create(thread_id, body)
    return thread_id, run["run_id"]


async def _outcome(
    resources: Resources, protocol_runs: ProtocolRuns, tool: str, thread_id: str, run_id: str
) -> types.CallToolResult:
    await ended(resources, thread_id, run_id)
    info = await protocol_runs.runs.get(run_id)
    found = await protocol_runs.threads.find(thread_id)
    state = await protocol_runs.threads.state_of(found)
    error = (info.error.code, info.error.message) if isinstance(info.error, RunError) else None
    resumable = found.info is not None and found.info.resumable
    return answer(tool, thread_id, run_id, info.status, error, resumable, values_with_interrupts(state))


@contextmanager
def _as_caller(scope: Scope) -> Iterator[None]:
    """Bind the caller the app's guard decided for this HTTP request (``scope["user"]``) while an
    MCP handler runs: its task is the session manager's, not the request's."""
    who: Caller = scope["user"]
    token = bind(who)
    structlog.contextvars.bind_contextvars(user=who.name)
    try:
        yield
    finally:
        unbind(token)
