"""A test's own HTTP server on loopback, in a thread of the test's process (pages for the fetch
tool, an SSE stream for the client's reader): :func:`serving`."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@contextlib.contextmanager
def serving(handler: type[BaseHTTPRequestHandler], *, daemon_threads: bool = False) -> Iterator[str]:
    """``handler`` served on a free port of 127.0.0.1; its base URL. ``daemon_threads``: a request
    still held (a stream) does not hold the shutdown. Shut down at the end."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = daemon_threads
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
