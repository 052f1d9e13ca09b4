"""The API's HTTP/1.1 parser: h11, or httptools with the same bound on a request's head.

``API_HTTP`` chooses (shared/speedups.py). h11 bounds what it buffers of a request's line and
headers while they are incomplete (``h11_max_incomplete_event_size``: a head that arrives whole
in one read is parsed, whatever its size). httptools, uvicorn's pick when it is installed, has
no such bound: a client could send headers of any size, all kept in memory (50 MB were taken,
measured). :class:`BoundedHttpTools` adds h11's, so either parser refuses a head still
incomplete past :data:`MAX_HEADER_BYTES` without waiting for its end
(tests/test_api_hardening.py runs both).
Bench figure 12 measures one against the other.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

#: Most bytes of a request's line and headers. No request of ours needs more than a bearer token
#: and an Idempotency-Key; nginx's default header buffers are 8 KiB too. Beyond: 400, closed.
MAX_HEADER_BYTES = 8 * 1024


class BoundedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol, refusing a request head still incomplete past
    MAX_HEADER_BYTES: every chunk received while a head is incomplete is counted (httptools
    keeps a header's pieces until it ends), and past the bound the connection ends with a
    400, as with h11. What a body brings is not counted: the head is complete by then.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pending_bytes = 0  # received while a head was incomplete
        self._in_head = True

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if not self._in_head or self.transport.is_closing():
            return
        self._pending_bytes += len(data)
        if self._pending_bytes > MAX_HEADER_BYTES:
            self.send_400_response("Request header too large.")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._pending_bytes = 0

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._pending_bytes = 0
        super().on_headers_complete()


def protocol(name: str) -> str | type[HttpToolsProtocol]:
    """uvicorn's ``http`` option for the choice: ``"h11"``, or the bounded httptools protocol."""
    return BoundedHttpTools if name == "httptools" else "h11"
