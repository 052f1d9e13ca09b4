"""Loopback HTTP listeners that a fetch must not reach: each request that gets there is recorded.

The fetch tool's tests (tests/test_secrets.py, tests/test_security.py) point a fetch, or a proxy
it might use, at these: a hit means something left the guard. Each listener answers ``inside``
as text/plain, on 127.0.0.1 and, asked for, on [::1].
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BODY = b"inside\n"


@dataclass
class Listeners:
    """The listeners' ports (in the order of the hosts asked for) and what reached them:
    ``"GET /path Host=name:port"`` per request (``CONNECT`` for one sent to them as a proxy)."""

    ports: list[int]
    hits: list[str] = field(default_factory=list)

    @property
    def port(self) -> int:
        return self.ports[0]


class _Server6(ThreadingHTTPServer):
    address_family = socket.AF_INET6


@contextlib.contextmanager
def loopback_listeners(*hosts: str) -> Iterator[Listeners]:
    """One listener per host of ``hosts`` (``127.0.0.1`` without any; ``::1`` is IPv6), stopped
    at the end."""
    hosts = hosts or ("127.0.0.1",)
    hits: list[str] = []

    class Recorder(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(f"{self.command} {self.path} Host={self.headers.get('Host')}")
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(BODY)))
            self.end_headers()
            self.wfile.write(BODY)

        do_CONNECT = do_GET

        def log_message(self, *args: object) -> None:
            pass

    servers = [(_Server6 if ":" in host else ThreadingHTTPServer)((host, 0), Recorder) for host in hosts]
    for server in servers:
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield Listeners([server.server_address[1] for server in servers], hits)
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
