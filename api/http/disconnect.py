"""A request whose client has left stops: for reads that work in a reader process, and for the
requests that wait for a run's end (the Agent Protocol's join and wait).

uvicorn never cancels a request's handler when its client disconnects; it only
answers ``http.disconnect`` to the next ``receive``. A thread read keeps a reader
process busy (api/http/readers.py), and a join keeps a relay of its run and a slot of the
client's stream limit (api/http/limits.py), so a client that gives up (a closed tab, a
proxy's timeout) would still hold them until the read, or the run, ends. This middleware
listens for the disconnect while the handler works and cancels the handler when it comes.

The request's body, if it has one (a length or a chunked encoding), is the handler's to read
(within its size limit): the listening starts once it has been read whole, so the two never
read at once. A handler with
work that must not be cut halfway (a run's creation) shields it.
"""

from __future__ import annotations

import anyio
from litestar.types import ASGIApp, Message, Receive, ReceiveMessage, Scope, Send

#: What the handler receives once its body was read: nothing more.
_NO_BODY: ReceiveMessage = {"type": "http.request", "body": b"", "more_body": False}


def _has_body(scope: Scope) -> bool:
    headers = dict(scope.get("headers") or [])
    return headers.get(b"content-length", b"0") not in (b"", b"0") or b"transfer-encoding" in headers


def cancel_on_disconnect(app: ASGIApp) -> ASGIApp:
    """Route middleware: the handler is cancelled when the client leaves before the answer starts."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        async with anyio.create_task_group() as request:
            listening = anyio.CancelScope()
            body_read = anyio.Event()
            answering = False

            async def listen() -> None:
                with listening:
                    await body_read.wait()
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    request.cancel_scope.cancel()

            async def sending(message: Message) -> None:
                nonlocal answering
                # Once the answer starts, a disconnect is only the answer's end: stop listening.
                if message["type"] == "http.response.start":
                    listening.cancel()
                    answering = True
                await send(message)

            async def body() -> ReceiveMessage:
                if answering:
                    # A streamed answer listens for the disconnect itself (the listener above
                    # has stopped): it gets the real one, not an endless empty body.
                    return await receive()
                if body_read.is_set():
                    return _NO_BODY
                message = await receive()
                if message["type"] != "http.request" or not message.get("more_body", False):
                    body_read.set()  # whole (or the client gone: the listener hears it next)
                if message["type"] == "http.disconnect":
                    request.cancel_scope.cancel()
                return message

            if not _has_body(scope):
                body_read.set()
            request.start_soon(listen)
            await app(scope, body, sending)
            listening.cancel()

    return middleware
