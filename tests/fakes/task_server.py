"""An MCP server whose tool is a long task (MCP Tasks, spec 2025-11-25), for tests:
``python tests/fakes/task_server.py`` (stdio) or ``--http PORT`` (Streamable HTTP on 127.0.0.1,
``/mcp``, in a process of its own that outlives any worker).

One tool, ``long(seconds, text)``: ``execution.taskSupport`` ``optional``, so a client may call it
as a task; it works for ``seconds`` (checking every 50 ms whether its task was cancelled), then
answers ``"done: <text>"``. ``text == "fail"`` makes it fail at the end. The server declares
``capabilities.tasks`` (tasks/get, tasks/result, tasks/cancel, tools/call as a task).

Its tasks are the server's, not a session's: ids are plain UUIDs (no session scope, unlike the
SDK's own ``run_task``, which binds a task to the session that made it: DESIGN.md "Facts measured"),
and the work runs in a task of the server's process, so a worker that died and came back on a new
session can ask for a task it made before. A stdio server dies with its worker: the restarted
worker's new server does not know the task (a task the server forgot).

Every call appends ``{"tool": "long", "args", "pid", "key", "task"}`` to ``TOOLS_LOG`` before it
works (``key``: the worker's idempotency key from ``_meta``; ``task``: the task id, null for a plain
call), then ``{"event": "done" | "cancelled", "task", "pid"}`` when it stops. Tests count runs there.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
import warnings
from datetime import UTC, datetime
from typing import Any

from mcp.server.lowlevel import Server
from mcp.shared.exceptions import McpError
from mcp.types import (
    INVALID_PARAMS,
    CallToolResult,
    CancelTaskRequest,
    CancelTaskResult,
    CreateTaskResult,
    ErrorData,
    GetTaskPayloadRequest,
    GetTaskPayloadResult,
    GetTaskRequest,
    GetTaskResult,
    Task,
    TextContent,
    Tool,
    ToolExecution,
)

warnings.simplefilter("ignore", DeprecationWarning)  # server.experimental: tasks are deprecated in mcp 1.30

server: Server[Any, Any] = Server("tasks")
REMOTE = "--http" in sys.argv
STEP = 0.05

#: the server's tasks (not a session's) and their results
TASKS: dict[str, Task] = {}
RESULTS: dict[str, CallToolResult] = {}
_CHANGED = asyncio.Event()
_WORK: set[asyncio.Task[None]] = set()


def _log(entry: dict[str, Any]) -> None:
    path = os.environ.get("TOOLS_LOG")
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps({**entry, "pid": os.getpid(), **({"remote": True} if REMOTE else {})})
                      + "\n").encode())
    finally:
        os.close(fd)


def _set(task_id: str, status: str, message: str | None = None) -> None:
    global _CHANGED
    TASKS[task_id] = TASKS[task_id].model_copy(update={
        "status": status, "statusMessage": message, "lastUpdatedAt": datetime.now(UTC),
    })
    _CHANGED.set()
    _CHANGED = asyncio.Event()


def _known(task_id: str) -> Task:
    task = TASKS.get(task_id)
    if task is None:
        raise McpError(ErrorData(code=INVALID_PARAMS, message=f"Task not found: {task_id}"))
    return task


async def _work(seconds: float, text: str, task_id: str | None) -> CallToolResult | None:
    """The tool's work; None when its task was cancelled meanwhile."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while loop.time() < end:
        if task_id is not None and TASKS[task_id].status == "cancelled":
            _log({"event": "cancelled", "task": task_id})
            return None
        await asyncio.sleep(STEP)
    _log({"event": "done", "task": task_id})
    failed = text == "fail"
    answer = f"{'failed' if failed else 'done'}: {text}"
    return CallToolResult(content=[TextContent(type="text", text=answer)], isError=failed)


async def _run_task(task_id: str, seconds: float, text: str) -> None:
    result = await _work(seconds, text, task_id)
    if result is None:
        return
    RESULTS[task_id] = result
    _set(task_id, "failed" if result.isError else "completed")


@server.list_tools()
async def list_tools() -> list[Tool]:
    return [Tool(
        name="long", description="Work for a while, then answer with the text.",
        inputSchema={"type": "object", "required": ["seconds", "text"],
                     "properties": {"seconds": {"type": "number"}, "text": {"type": "string"}}},
        execution=ToolExecution(taskSupport="optional"),
    )]


@server.call_tool()
async def call_tool(name: str, arguments: dict[str, Any]) -> CallToolResult | CreateTaskResult:
    context = server.request_context
    meta = context.meta
    key = (meta.model_extra or {}).get("sophos/idempotency-key") if meta is not None else None
    seconds, text = float(arguments["seconds"]), str(arguments["text"])
    if not context.experimental.is_task:
        _log({"tool": name, "args": arguments, "key": key, "task": None})
        return await _work(seconds, text, None) or CallToolResult(content=[])
    now = datetime.now(UTC)
    task = Task(taskId=str(uuid.uuid4()), status="working", createdAt=now, lastUpdatedAt=now,
                ttl=context.experimental.task_metadata.ttl if context.experimental.task_metadata else None,
                pollInterval=100)
    TASKS[task.taskId] = task
    _log({"tool": name, "args": arguments, "key": key, "task": task.taskId})
    work = asyncio.create_task(_run_task(task.taskId, seconds, text))  # the server's, not the session's
    _WORK.add(work)
    work.add_done_callback(_WORK.discard)
    return CreateTaskResult(task=task)


@server.experimental.get_task()
async def get_task(request: GetTaskRequest) -> GetTaskResult:
    return GetTaskResult(**_known(request.params.taskId).model_dump())


@server.experimental.get_task_result()
async def get_task_result(request: GetTaskPayloadRequest) -> GetTaskPayloadResult:
    task_id = request.params.taskId
    while _known(task_id).status == "working":
        await _CHANGED.wait()
    result = RESULTS.get(task_id)
    return GetTaskPayloadResult.model_validate(result.model_dump(by_alias=True) if result else {})


@server.experimental.cancel_task()
async def cancel_task(request: CancelTaskRequest) -> CancelTaskResult:
    task_id = request.params.taskId
    if _known(task_id).status != "working":
        raise McpError(ErrorData(code=INVALID_PARAMS, message=f"Task {task_id} is {TASKS[task_id].status}"))
    _set(task_id, "cancelled", "cancelled by the client")
    return CancelTaskResult(**TASKS[task_id].model_dump())


async def serve_stdio() -> None:
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def serve_http(port: int) -> None:
    import contextlib

    import uvicorn
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

    manager = StreamableHTTPSessionManager(app=server)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            message = await receive()
            async with contextlib.AsyncExitStack() as stack:
                await stack.enter_async_context(manager.run())
                await send({"type": "lifespan.startup.complete"})
                message = await receive()
            assert message["type"] == "lifespan.shutdown"
            await send({"type": "lifespan.shutdown.complete"})
            return
        await manager.handle_request(scope, receive, send)

    print(f"Task MCP server on http://127.0.0.1:{port}/mcp", file=sys.stderr, flush=True)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")


if __name__ == "__main__":
    if REMOTE:
        serve_http(int(sys.argv[sys.argv.index("--http") + 1]))
    else:
        asyncio.run(serve_stdio())
