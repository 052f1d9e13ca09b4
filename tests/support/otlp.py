"""A loopback OTLP/HTTP receiver: what an OpenTelemetry collector would be sent, kept in memory.

``POST /v1/traces`` with a protobuf ``ExportTraceServiceRequest`` (as the SDK's OTLP/HTTP
exporter sends it, gzip or not), decoded with opentelemetry-proto; each span is kept as a
:class:`Span` (ids in hex, attributes as plain Python values). Used by tests/test_tracing.py
and by the benchmark's tracing figure (bench/tracing.py).
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

#: OTLP's span kinds, by number (opentelemetry-proto's Span.SpanKind)
KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return getattr(value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs if isinstance(pair, KeyValue)}


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str | None
    kind: str
    attributes: dict[str, Any]
    #: (trace id, span id) of each link
    links: list[tuple[str, str]]
    events: list[str]
    #: 0 unset, 1 ok, 2 error
    status: int
    start_ns: int
    end_ns: int

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


@dataclass
class OtlpReceiver:
    """``with OtlpReceiver() as otlp:`` ... ``otlp.url`` is the endpoint to export to."""

    spans: list[Span] = field(default_factory=list)
    requests: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> OtlpReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                receiver._keep(ExportTraceServiceRequest.FromString(body))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                         name="otlp-receiver", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _keep(self, request: ExportTraceServiceRequest) -> None:
        found = []
        for resource_spans in request.resource_spans:
            service = str(_attributes(resource_spans.resource.attributes).get("service.name", ""))
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    found.append(Span(
                        service=service, name=s.name, trace_id=s.trace_id.hex(), span_id=s.span_id.hex(),
                        parent_id=s.parent_span_id.hex() or None, kind=KINDS.get(s.kind, str(s.kind)),
                        attributes=_attributes(s.attributes),
                        links=[(link.trace_id.hex(), link.span_id.hex()) for link in s.links],
                        events=[e.name for e in s.events], status=s.status.code,
                        start_ns=s.start_time_unix_nano, end_ns=s.end_time_unix_nano,
                    ))
        with self._lock:
            self.spans.extend(found)
            self.requests += 1

    def snapshot(self) -> list[Span]:
        with self._lock:
            return list(self.spans)

    def trace(self, trace_id: str) -> list[Span]:
        return [s for s in self.snapshot() if s.trace_id == trace_id]

    def wait(self, found: Callable[[list[Span]], Any], timeout: float = 20.0, message: str = "spans") -> Any:
        """The first truthy ``found(spans)``, looked at as spans arrive; TimeoutError after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            result = found(self.snapshot())
            if result:
                return result
            if time.monotonic() > deadline:
                names = sorted({(s.service, s.name) for s in self.snapshot()})
                raise TimeoutError(f"no {message} within {timeout}s; received: {names}")
            time.sleep(0.05)
