"""Long tool calls as MCP tasks (spec 2025-11-25): every use of MCP Tasks is in this module.

mcp 1.30 offers tasks as ``session.experimental`` and warns that SEP-1686 left the core spec for an
extension (``io.modelcontextprotocol/tasks``): when that lands, this module is what changes.

Where a server declares ``capabilities.tasks`` for ``tools/call`` and a tool says it may run as one
(``execution.taskSupport`` ``optional`` or ``required``: :func:`task_capable`), the call is made as a
task (:func:`call_as_task`): the server answers at once with a task id, which the ledger commits
beside the call's intent (:func:`worker.tools.ledger.attempt.task_state`), then the
worker waits for the task's end, polling ``tasks/get`` (each state the server reports is recorded),
and fetches its result with ``tasks/result``.

After a crash the resume asks the server (:func:`resume_task`) instead of sending the call again or
asking a person: a completed task's result is the call's outcome, a working one is waited for, a
failed or cancelled one is its error; a task the server no longer knows (an unknown id: a server
that restarted, or a stdio server that died with its worker) is :class:`TaskForgotten`, and the call
is uncertain as before. A server built on the SDK's own task support binds a task to the session
that made it, so after a crash it looks like one that forgot it (DESIGN.md "Facts measured").

Cancelling the coroutine that waits for a task cancels no task on the server (mcp sends neither
``notifications/cancelled`` nor ``tasks/cancel``): a cancelled wait (a run cancelled, or stopped
past ``SHUTDOWN_TIMEOUT``) sends ``tasks/cancel`` itself before it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import warnings
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool, ToolException
from mcp import ClientSession
from mcp.client.experimental import ExperimentalClientFeatures
from mcp.shared.exceptions import McpError
from mcp.types import INVALID_PARAMS, CallToolResult, TextContent, Tool

log = structlog.get_logger(__name__)

#: states a task ends in (spec 2025-11-25); ``working`` and ``input_required`` are not
TERMINAL = ("completed", "failed", "cancelled")
#: the task's lifetime on the server we ask for: long enough for a worker to die, restart and ask
TASK_TTL_MS = 3_600_000
#: the longest pause between two polls of a task, whatever the server suggests (seconds)
MAX_POLL = 2.0
#: how long a ``tasks/cancel`` sent while a wait is cancelled may take (seconds)
CANCEL_TIMEOUT = 5.0

#: called with the task's id and each state the server reports, from its creation on
OnState = Callable[[str, str], Awaitable[None]]
#: a wrapped MCP tool's ``metadata`` key (worker/tools/mcp.py): its calls are made as tasks, and this
#: coroutine function asks its server for a task's result (its text; a ``ToolException`` if the task
#: failed or was cancelled; :class:`TaskForgotten`)
ASK_TASK = "sophos_ask_task"


class TaskForgotten(Exception):
    """The server does not know the task (an unknown id): the call may or may not have run."""


class TaskLost(Exception):
    """A task was made, and following it failed (the transport, a request that timed out, an error
    answer): it may be running still. Never a plain error for the model, which would call again and
    make a second task: the call is unanswered (worker/tools/ledger/), and asked for again later."""


def task_asker(
    tool: BaseTool | None, call: dict[str, Any],
) -> Callable[[str], Awaitable[ToolMessage | None]] | None:
    """For a call of a tool whose calls are tasks: what the ledger asks after a crash (its
    ``AskTask``): the call's tool message from the task's result, or None if the server forgot it."""
    ask = (tool.metadata or {}).get(ASK_TASK) if tool is not None else None
    if ask is None:
        return None

    async def answer(task_id: str) -> ToolMessage | None:
        try:
            text = await ask(task_id)
        except TaskForgotten:
            return None
        except ToolException as exc:  # the task failed or was cancelled: an outcome, told the model
            return ToolMessage(f"Error: {exc}", tool_call_id=call["id"], name=call["name"], status="error")
        return ToolMessage(text, tool_call_id=call["id"], name=call["name"], status="success")

    return answer


def _features(session: ClientSession) -> ExperimentalClientFeatures:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # tasks are "experimental" in mcp 1.30
        return session.experimental


def task_capable(session: ClientSession, tool: Tool) -> bool:
    """Whether calls of ``tool`` on ``session``'s server are made as tasks."""
    capabilities = session.get_server_capabilities()
    tasks = capabilities.tasks if capabilities is not None else None
    tools = tasks.requests.tools if tasks is not None and tasks.requests is not None else None
    calls = tools.call if tools is not None else None
    mode = tool.execution.taskSupport if tool.execution is not None else None
    return calls is not None and mode in ("optional", "required")


async def call_as_task(
    session: ClientSession, name: str, arguments: dict[str, Any], *, meta: dict[str, Any] | None,
    on_state: OnState, request_timeout: float,
) -> CallToolResult:
    """Call ``name`` as a task and wait for its result; ``on_state`` hears its id first of all.

    Each request waits at most ``request_timeout`` (a ``TimeoutError`` then: the caller's
    unanswered call); the task itself may take as long as the server says it is working."""
    created = await asyncio.wait_for(
        _features(session).call_tool_as_task(name, arguments, ttl=TASK_TTL_MS, meta=meta), request_timeout,
    )
    task_id = created.task.taskId
    log.info("tool_task.created", tool=name, task_id=task_id, status=created.task.status)
    try:
        await on_state(task_id, created.task.status)
        return await _until_done(session, task_id, created.task.status, created.task.pollInterval, on_state,
                                 request_timeout)
    except Exception as exc:
        raise TaskLost(f"following its task failed: {type(exc).__name__}: {exc}") from None


async def resume_task(
    session: ClientSession, task_id: str, *, on_state: OnState, request_timeout: float,
) -> CallToolResult:
    """The result of a task made before a crash, waited for if it is still working; raises
    :class:`TaskForgotten` if the server does not know it."""
    try:
        status = await asyncio.wait_for(_features(session).get_task(task_id), request_timeout)
    except McpError as exc:
        if exc.error.code == INVALID_PARAMS:  # the spec's answer for an unknown task id
            raise TaskForgotten(exc.error.message) from None
        raise
    log.info("tool_task.asked_after_crash", task_id=task_id, status=status.status)
    await on_state(task_id, status.status)
    return await _until_done(session, task_id, status.status, status.pollInterval, on_state, request_timeout)


async def _until_done(
    session: ClientSession, task_id: str, status: str, poll_ms: int | None, on_state: OnState,
    request_timeout: float,
) -> CallToolResult:
    features = _features(session)
    message: str | None = None
    pause = 0.0  # asked again at once: a quick task is done without a poll interval's wait
    try:
        while status not in TERMINAL:
            await asyncio.sleep(pause)
            pause = min((poll_ms or 500) / 1000, MAX_POLL)
            polled = await asyncio.wait_for(features.get_task(task_id), request_timeout)
            poll_ms, message = polled.pollInterval, polled.statusMessage
            if polled.status != status:
                status = polled.status
                await on_state(task_id, status)
    except asyncio.CancelledError:
        await _cancel(session, task_id, on_state)
        raise
    if status == "cancelled":
        return _error(f"the tool's task was cancelled on its server{f': {message}' if message else ''}")
    result = await asyncio.wait_for(features.get_task_result(task_id, CallToolResult), request_timeout)
    if status == "failed" and not result.content:
        return _error(f"the tool's task failed{f': {message}' if message else ''}")
    return result


async def _cancel(session: ClientSession, task_id: str, on_state: OnState) -> None:
    """Cancel the task on its server, and record its state: the run that waited for it is cancelled
    or stopping."""

    async def cancel() -> None:
        answer = await asyncio.wait_for(_features(session).cancel_task(task_id), CANCEL_TIMEOUT)
        log.info("tool_task.cancelled", task_id=task_id, status=answer.status)
        await on_state(task_id, answer.status)

    # Shielded: this coroutine is being cancelled, and the request must still go out and its
    # answer be recorded. A second cancel (the run's task and arq's job are both cut when a worker
    # stops past SHUTDOWN_TIMEOUT) waits for it too, CANCEL_TIMEOUT at most: else the worker
    # could exit before the ledger says the task was cancelled. The caller raises CancelledError
    # once this returns.
    sent = asyncio.ensure_future(cancel())
    while not sent.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(sent)
    if not sent.cancelled() and (exc := sent.exception()) is not None:
        # already ended, or the server is gone: nothing left to stop
        log.warning("tool_task.cancel_failed", task_id=task_id, error=f"{type(exc).__name__}: {exc}")


def _error(text: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)], isError=True)
