"""One structured log line per request, in place of uvicorn's access log.

Also gives each request a clean log context, so conversation and run ids bound
by a handler never leak into another request's lines. The query string is never
logged: it may carry ``access_token``.
"""

from __future__ import annotations

import time

import structlog
from litestar.types import ASGIApp, Message, Receive, ReceiveMessage, Scope, Send

log = structlog.get_logger("api.access")


def access_log(app: ASGIApp) -> ASGIApp:
    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        structlog.contextvars.clear_contextvars()
        started = time.perf_counter()
        # Read now: routing to a mounted app (/mcp) cuts the mount's own path off scope["path"].
        path = scope.get("path")
        status: int | None = None
        disconnected = False

        async def receive_wrapper() -> ReceiveMessage:
            nonlocal disconnected
            message = await receive()
            if message["type"] == "http.disconnect":
                disconnected = True
            return message

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        failed = False
        try:
            await app(scope, receive_wrapper, send_wrapper)
        except BaseException:
            failed = True
            raise
        finally:
            fields: dict[str, object] = {}
            if (status is None or status >= 500) and (disconnected or (status is None and not failed)):
                # Never answered: the client went away first (before its body ended, say),
                # and what the app then tried to send (an error about the missing body)
                # reached no one. Not a 5xx: alerts on 5xx must not fire for it.
                status = None
                fields["outcome"] = "client_disconnected"
            elif status is None:
                status = 500  # uvicorn answers an exception that escaped with a 500
            log.info(
                "request",
                method=scope.get("method"),
                path=path,
                status=status,
                duration_ms=round((time.perf_counter() - started) * 1000, 1),
                **fields,
            )
            structlog.contextvars.clear_contextvars()

    return middleware
