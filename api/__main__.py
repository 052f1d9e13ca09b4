"""``python -m api``: read settings, configure logging, serve the app with uvicorn."""

from __future__ import annotations

import os
import socket
import sys
import threading
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import uvicorn

    from shared.settings import Settings

#: Seconds uvicorn waits for open requests before cancelling them on SIGTERM. Event
#: streams end by themselves within a second of the signal (see ``draining``).
GRACEFUL_SHUTDOWN_SECONDS = 3
#: An idle kept-alive connection is closed after this (uvicorn's default, made explicit).
#: uvicorn has no bound on the time a client may take to send its headers: a proxy
#: in front sets it (deploy/: nginx's client_header_timeout).
KEEP_ALIVE_SECONDS = 5


def listening_socket(config: uvicorn.Config, client_timeout: float) -> socket.socket:
    """uvicorn's socket, set so the kernel drops a connection whose client stops reading.

    A client that stops reading shuts its TCP window, and uvicorn's ``send`` then
    waits for the write buffer to drain, for ever. With TCP_USER_TIMEOUT (inherited
    by every accepted connection) the kernel aborts a connection whose sent data has
    waited that long, zero window included (Linux 5.11+); uvicorn sees the connection
    lost and the stream's relay is cancelled, costing no one else anything.
    """
    sock = config.bind_socket()
    if hasattr(socket, "TCP_USER_TIMEOUT") and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, max(1, round(client_timeout * 1000)))
    return sock


def main() -> int:
    # Read by LangGraph when its serializer module is imported: set it first.
    os.environ.setdefault("LANGGRAPH_STRICT_MSGPACK", "true")

    import uvicorn

    from api.app import create_app
    from api.auth.bearer import exposure_problem
    from api.http.parser import MAX_HEADER_BYTES, protocol
    from shared import tracing
    from shared.logging import configure_logging
    from shared.settings import Settings
    from shared.settings_parsing import SettingsError
    from shared.speedups import Speedups

    try:
        settings = Settings.from_env()
        speedups = Speedups.of(settings)
    except SettingsError as exc:
        print(f"sophos-api: {exc}", file=sys.stderr)
        return 2
    problem = exposure_problem(settings)
    if problem is not None and _keys_in_force(settings):
        problem = None  # users' keys guard it (read only when it matters: beyond loopback)
    if problem is not None:
        print(f"sophos-api: refusing to start: {problem}", file=sys.stderr)
        return 2
    configure_logging(settings.log_format, trace_ids=settings.tracing)
    speedups.apply_json_codec()
    tracing.setup(settings, "sophos-api")

    draining = threading.Event()

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            draining.set()  # a plain flag: safe to set from a signal handler
            super().handle_exit(sig, frame)

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            await super().shutdown(sockets)
            # Here, not after run(): uvicorn raises the signal that stopped it again once it
            # has shut down, which ends the process before run() returns.
            tracing.shutdown()  # the spans still buffered are exported

    config = uvicorn.Config(
        create_app(settings, draining=draining),
        host=settings.api_host,
        port=settings.api_port,
        access_log=False,  # api.http.access_log logs each request through structlog
        log_config=None,
        lifespan="on",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
        server_header=False,
        http=protocol(speedups.api_http),  # either bounds a request's head (api/http/parser.py)
        loop=speedups.event_loop,  # uvicorn's names: "uvloop" or "asyncio"
        h11_max_incomplete_event_size=MAX_HEADER_BYTES,
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
        # scope["client"] (what the per-client limits count) comes from
        # X-Forwarded-For only when the peer is one of these proxies.
        proxy_headers=True,
        forwarded_allow_ips=settings.forwarded_allow_ips,
    )
    server = Server(config)
    try:
        server.run(sockets=[listening_socket(config, settings.sse_client_timeout)])
    finally:
        tracing.shutdown()  # a server that never started (shutdown above did it otherwise)
    return 0 if server.started else 1



def _keys_in_force(settings: Settings) -> bool:
    """Whether a user exists (keys made by ``sophos users add`` guard the API), read once
    before serving; a database that cannot be read yet has none."""
    import asyncio

    from shared.errors import DatabaseUnavailable
    from shared.storage.engines import open_reader
    from shared.users import USERS_MIGRATION, keys_in_force

    async def ask() -> bool:
        reader = open_reader(settings)
        try:
            version = await reader.schema_version()
            return version is not None and version >= USERS_MIGRATION and await keys_in_force(reader)
        except DatabaseUnavailable:
            return False
        finally:
            await reader.close()

    return asyncio.run(ask())


if __name__ == "__main__":
    sys.exit(main())

