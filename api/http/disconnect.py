"""A request whose client has left stops: for reads that work in a reader process.

uvicorn never cancels a request's handler when its client disconnects; it only
answers ``http.disconnect`` to the next ``receive``. A thread read keeps a reader
process busy (api/http/readers.py), so a client that gives up (a closed tab, a proxy's
timeout) would still hold one of the few readers until the read ends. This
middleware listens for the disconnect while the handler works and cancels the
handler when it comes, which stops the read and its reader.
"""

from __future__ import annotations

import anyio
from litestar.types import ASGIApp, Message, Receive, ReceiveMessage, Scope, Send

#: What the handler receives in place of the body: the routes using this take none.
_NO_BODY: ReceiveMessage = {"type": "http.request", "body": b"", "more_body": False}


def cancel_on_disconnect(app: ASGIApp) -> ASGIApp:
    """Route middleware for bodiless requests: the handler is cancelled when the client leaves."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        async with anyio.create_task_group() as request:
            listening = anyio.CancelScope()

            async def listen() -> None:
                with listening:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    request.cancel_scope.cancel()

            async def sending(message: Message) -> None:
                # Once the answer starts, a disconnect is only the answer's end: stop listening.
                if message["type"] == "http.response.start":
                    listening.cancel()
                await send(message)

            async def body() -> ReceiveMessage:
                return _NO_BODY

            request.start_soon(listen)
            await app(scope, body, sending)
            listening.cancel()

    return middleware
