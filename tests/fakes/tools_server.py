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

Over stdio (what nearly every test's worker starts, once per worker start) the server is
:func:`serve_stdio`, MCP's JSON-RPC over stdin and stdout with the standard library alone:
importing the ``mcp`` package's FastMCP cost each worker start about a second of CPU, most of
the fake's start. It answers what FastMCP answers, but for the wording of pydantic's validation
errors (``--fastmcp`` runs FastMCP over stdio instead, and tests/test_fakes.py holds the two to
the same answers); over HTTP the server is FastMCP's own.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Callable
from typing import Any

STARTED_LINE = "Tools MCP Server running on stdio"
REMOTE = "--http" in sys.argv
SSE = "--sse" in sys.argv
KEY = "sophos/idempotency-key"


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


def _called(tool: str, key: str | None, **args: Any) -> None:
    _log({"tool": tool, "args": args, "pid": os.getpid(), "key": key, **({"remote": True} if REMOTE else {})})


# --- the tools, once: each takes the call's idempotency key (``_meta``) after its arguments ---


def echo(text: str, key: str | None) -> str:
    """Return the text unchanged."""
    _called("echo", key, text=text)
    return text


def add(a: int, b: int, key: str | None) -> int:
    """Add two integers."""
    _called("add", key, a=a, b=b)
    return a + b


async def slow(seconds: float, key: str | None) -> str:
    """Sleep for the given number of seconds, then say so."""
    _called("slow", key, seconds=seconds)
    await asyncio.sleep(seconds)
    _log({"tool": "slow", "event": "done", "pid": os.getpid()})
    return f"slept {seconds}s"


def fail(message: str, key: str | None) -> str:
    """Always fail with the given message."""
    _called("fail", key, message=message)
    raise RuntimeError(message)


def vanish(key: str | None) -> str:
    """End this server's process in the middle of the call."""
    _called("vanish", key)
    os._exit(3)


#: name -> (function, {argument: JSON Schema type}, result type), in FastMCP's listing order
TOOLS: dict[str, tuple[Callable[..., Any], dict[str, str], str]] = {
    "echo": (echo, {"text": "string"}, "string"),
    "add": (add, {"a": "integer", "b": "integer"}, "integer"),
    "slow": (slow, {"seconds": "number"}, "string"),
    "fail": (fail, {"message": "string"}, "string"),
    "vanish": (vanish, {}, "string"),
}


# --- over stdio: MCP's JSON-RPC with the standard library ---------------------------------------

#: what mcp 1.30's server accepts (mcp.shared.version; tests/test_fakes.py checks it)
PROTOCOL_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
SERVER_VERSION = "1.30.0"  # what FastMCP names itself: the mcp package's version (ditto)


def listing() -> list[dict[str, Any]]:
    """``tools/list``'s tools, as FastMCP derives them from the functions' signatures."""
    tools = []
    for name, (function, arguments, result) in TOOLS.items():
        schema: dict[str, Any] = {
            "properties": {arg: {"title": arg.title(), "type": kind} for arg, kind in arguments.items()},
            **({"required": list(arguments)} if arguments else {}),
            "title": f"{name}Arguments", "type": "object",
        }
        tools.append({
            "name": name, "description": function.__doc__, "inputSchema": schema,
            "outputSchema": {
                "properties": {"result": {"title": "Result", "type": result}}, "required": ["result"],
                "title": f"{name}Output", "type": "object",
            },
            "annotations": {"readOnlyHint": True},
        })
    return tools


def _integer(value: Any) -> int:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return int(value)
    raise ValueError("Input should be a valid integer")


def _number(value: Any) -> float:
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        return float(value)  # an integer too: slow(2) says "slept 2.0s", as under FastMCP
    raise ValueError("Input should be a valid number")


def _string(value: Any) -> str:
    if isinstance(value, str):
        return value
    raise ValueError("Input should be a valid string")


#: pydantic's lax conversions, as FastMCP validates arguments ("2" is the integer 2, 2.5 is refused)
_TYPES: dict[str, Callable[[Any], Any]] = {"integer": _integer, "number": _number, "string": _string}


def _arguments(name: str, types: dict[str, str], given: dict[str, Any]) -> dict[str, Any]:
    converted, wrong = {}, []
    for arg, kind in types.items():
        try:
            if arg not in given:
                raise ValueError("Field required")
            converted[arg] = _TYPES[kind](given[arg])
        except ValueError as exc:
            wrong.append(f"{arg}\n  {str(exc).splitlines()[0]}")
    if wrong:
        many = "s" if len(wrong) > 1 else ""
        raise ValueError(f"{len(wrong)} validation error{many} for {name}Arguments\n" + "\n".join(wrong))
    return converted


async def call(name: str, arguments: dict[str, Any], key: str | None) -> dict[str, Any]:
    """``tools/call``'s result: the content and the structured result, or an error result."""
    if name not in TOOLS:
        return {"content": [{"type": "text", "text": f"Unknown tool: {name}"}], "isError": True}
    function, types, _ = TOOLS[name]
    try:
        value = function(**_arguments(name, types, arguments), key=key)
        if asyncio.iscoroutine(value):
            value = await value
    except Exception as exc:
        return {"content": [{"type": "text", "text": f"Error executing tool {name}: {exc}"}], "isError": True}
    return {"content": [{"type": "text", "text": str(value)}], "structuredContent": {"result": value},
            "isError": False}


def _initialized(params: dict[str, Any]) -> dict[str, Any]:
    asked = params.get("protocolVersion")
    return {
        "protocolVersion": asked if asked in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[-1],
        "capabilities": {
            "experimental": {}, "prompts": {"listChanged": False},
            "resources": {"subscribe": False, "listChanged": False}, "tools": {"listChanged": False},
        },
        "serverInfo": {"name": "tools", "version": SERVER_VERSION},
    }


async def _answer(request: dict[str, Any]) -> dict[str, Any]:
    method, params = request.get("method"), request.get("params") or {}
    if method == "initialize":
        return {"result": _initialized(params)}
    if method == "ping":
        return {"result": {}}
    if method == "tools/list":
        return {"result": {"tools": listing()}}
    if method == "tools/call":
        key = (params.get("_meta") or {}).get(KEY)
        return {"result": await call(params.get("name", ""), params.get("arguments") or {}, key)}
    return {"error": {"code": -32601, "message": "Method not found"}}


async def serve_stdio() -> None:
    """Each request answered in a task of its own (``slow`` holds no other call up); a request
    cancelled by ``notifications/cancelled`` is answered as the mcp package answers it."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2**24)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    out = sys.stdout.buffer
    running: dict[Any, asyncio.Task[None]] = {}

    def send(message: dict[str, Any]) -> None:
        out.write(json.dumps({"jsonrpc": "2.0", **message}, separators=(",", ":")).encode() + b"\n")
        out.flush()

    async def handle(request: dict[str, Any]) -> None:
        try:
            send({"id": request["id"], **await _answer(request)})
        finally:
            running.pop(request["id"], None)

    while line := await reader.readline():
        try:
            message = json.loads(line)
        except ValueError:
            send({"id": None, "error": {"code": -32700, "message": "Parse error"}})
            continue
        if "id" in message and "method" in message:
            running[message["id"]] = asyncio.create_task(handle(message))
        elif message.get("method") == "notifications/cancelled":
            cancelled = (message.get("params") or {}).get("requestId")
            task = running.pop(cancelled, None)
            if task is not None:  # (a task that has answered is no longer running)
                task.cancel()
                send({"id": cancelled, "error": {"code": 0, "message": "Request cancelled"}})
    for task in running.values():
        task.cancel()


# --- FastMCP: over HTTP, and over stdio with --fastmcp (the reference the tests compare with) ---


def serve_http(port: int) -> None:
    """The tools over Streamable HTTP on loopback, behind the bearer token ``TOOLS_TOKEN``."""
    import uvicorn
    from tools_fastmcp import build  # beside this file, which runs as a script

    server = build(sys.modules[__name__])

    expected = f"Bearer {os.environ['TOOLS_TOKEN']}".encode()
    app = server.sse_app() if SSE else server.streamable_http_app()

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
        if "--fastmcp" in sys.argv:
            from tools_fastmcp import build

            build(sys.modules[__name__]).run("stdio")
        else:
            asyncio.run(serve_stdio())
