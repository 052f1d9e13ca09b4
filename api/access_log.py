"""One structured log line per request, in place of uvicorn's access log.

Also gives each request a clean log context, so conversation and run ids bound
by a handler never leak into another request's lines. The query string is never
logged: it may carry ``access_token``.
"""

from __future__ import annotations

import time

import structlog
from litestar.types import ASGIApp, Message, Receive, Scope, Send

log = structlog.get_logger("api.access")


def access_log(app: ASGIApp) -> ASGIApp:
    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        structlog.contextvars.clear_contextvars()
        started = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await app(scope, receive, send_wrapper)
        finally:
            log.info(
                "request",
                method=scope.get("method"),
                path=scope.get("path"),
                status=status,
                duration_ms=round((time.perf_counter() - started) * 1000, 1),
            )
            structlog.contextvars.clear_contextvars()

    return middleware
