"""``/mcp``, the mount of the agent's MCP server (api/protocol/mcp.py), behind the app's one guard.

MCP's server side (the ``mcp`` package, about 0.3 s of CPU to import and 13 MB) is loaded on the
first request to ``/mcp``, not when an API process starts: most processes never serve one. Its
session manager then runs in the task group this mount's lifespan holds, until the app stops.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import anyio
from anyio.abc import TaskGroup, TaskStatus
from litestar import Litestar
from litestar.handlers import asgi
from litestar.types import Receive, Scope, Send

from api.http.limits import FOLLOWS_A_RUN

if TYPE_CHECKING:
    from api.protocol.mcp import McpServer

PATH = "/mcp"


class McpMount:
    """The route at ``/mcp`` and the lifespan that runs the server once a request made it."""

    def __init__(self, max_body_bytes: int) -> None:
        self._max_body_bytes = max_body_bytes
        self._server: McpServer | None = None
        self._group: TaskGroup | None = None
        self._lock = anyio.Lock()
        mount = self

        async def serve(scope: Scope, receive: Receive, send: Send) -> None:
            await (await mount._started()).handle(scope, receive, send)

        # A function, not a bound method: Litestar deep-copies its handlers, and a bound method's
        # copy would serve a copy of this mount, whose server no lifespan runs. Behind the app's
        # guard, as every route (identify runs before the mount is called).
        self.route = asgi(PATH, is_mount=True, copy_scope=True, opt={FOLLOWS_A_RUN: True})(serve)

    @asynccontextmanager
    async def lifespan(self, _: Litestar) -> AsyncIterator[None]:
        async with anyio.create_task_group() as group:
            self._group = group
            try:
                yield
            finally:
                self._group = None
                group.cancel_scope.cancel()

    async def _started(self) -> McpServer:
        if self._server is None:
            async with self._lock:
                if self._server is None:
                    from api.protocol.mcp import McpServer

                    if self._group is None:
                        raise RuntimeError("/mcp served outside the app's lifespan")
                    server = McpServer(self._max_body_bytes)
                    await self._group.start(_run, server)
                    self._server = server
        return self._server


async def _run(server: McpServer, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
    async with server.manager.run():
        task_status.started()
        await anyio.sleep_forever()
