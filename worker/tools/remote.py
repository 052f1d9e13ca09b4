"""A session to a remote MCP server: Streamable HTTP, or the older HTTP+SSE transport.

mcp's own clients (``mcp.client.streamable_http``, ``mcp.client.sse``) over an httpx client
that carries the server's headers (``Authorization: Bearer ${TOKEN}``: worker/tools/config.py).
Connect and write timeouts are short, reads as long as a call may take: how long a call may
wait for its answer is the worker's (``MCP_CALL_TIMEOUT``, worker/tools/mcp.py), not httpx's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from mcp import ClientSession
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client

#: seconds to connect or send a request; reading an answer waits as long as a call may
CONNECT_TIMEOUT = 10.0


def _timeout(call_timeout: float) -> httpx.Timeout:
    # The read of a POST's answer (or of the SSE stream) outlasts the call's own timeout, so
    # the worker's timeout is the one that ends a call that gets no answer.
    return httpx.Timeout(CONNECT_TIMEOUT, read=max(300.0, call_timeout + 30.0))


@asynccontextmanager
async def open_remote_session(
    connection: dict[str, Any], *, call_timeout: float,
) -> AsyncIterator[ClientSession]:
    """A session to the remote server of ``connection`` (see ``load_config``), not initialized."""
    url, headers = connection["url"], dict(connection.get("headers") or {})
    if connection["transport"] == "sse":
        timeout = _timeout(call_timeout)
        async with (
            sse_client(url, headers=headers, timeout=CONNECT_TIMEOUT, sse_read_timeout=timeout.read or 300.0)
            as (read, write),
            ClientSession(read, write) as session,
        ):
            yield session
        return
    async with (
        httpx.AsyncClient(headers=headers, timeout=_timeout(call_timeout), follow_redirects=True) as http,
        streamable_http_client(url, http_client=http) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        yield session
