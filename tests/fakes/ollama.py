"""A scripted stand-in for Ollama, speaking its HTTP wire protocol.

The model is an edge we do not own, so tests replace it with this server: the
worker's real ``ChatOllama`` talks to it over real HTTP. Replies are scripted and
consumed in order, one per ``POST /api/chat``::

    with FakeOllama() as fake:
        fake.script(Text("Hello there."), ToolCalls([("tools__add", {"a": 1, "b": 2})]), Text("3"))
        ...  # point OLLAMA_HOST at fake.url

When the script runs out, every request gets ``Text(fake.default_text)``.

Wire format (as measured against Ollama): the answer to ``/api/chat`` is
``application/x-ndjson`` sent with chunked transfer encoding, one JSON object per
line, flushed per line; content pieces have ``"done": false``; tool calls come in
a line of their own; the last line has ``"done": true`` and the usage counters.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import select
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = [
    "Drop",
    "FakeOllama",
    "Hang",
    "Reply",
    "Status",
    "StreamError",
    "Text",
    "ToolCalls",
    "split_tokens",
]

_TOKEN_RE = re.compile(r"\s+|\S+\s*")


def split_tokens(text: str) -> list[str]:
    """Split ``text`` into pieces whose concatenation is exactly ``text``.

    Words keep their following whitespace; leading whitespace is a piece of its own.
    """
    if not text:
        return []
    pieces = _TOKEN_RE.findall(text)
    assert "".join(pieces) == text
    return pieces


# --- replies ------------------------------------------------------------------------


@dataclass
class Text:
    """Stream ``text`` as tokens, then the final ``done`` line."""

    text: str
    token_delay: float = 0.0
    #: Explicit pieces; by default ``split_tokens(text)``.
    tokens: Sequence[str] | None = None
    #: Optional reasoning text, sent as ``message.thinking`` before the content.
    thinking: str | None = None

    def pieces(self) -> list[str]:
        return list(self.tokens) if self.tokens is not None else split_tokens(self.text)


@dataclass
class ToolCalls:
    """Optionally stream ``text``, then one line carrying ``tool_calls``, then ``done``.

    ``calls`` is a list of ``(name, arguments)``; names are as the model sees them
    (``server__tool``). Ollama sends no call ids: ChatOllama makes them up.
    """

    calls: Sequence[tuple[str, dict[str, Any]]]
    text: str = ""
    token_delay: float = 0.0


@dataclass
class Hang:
    """Hold the response open until :meth:`release`, :meth:`FakeOllama.reset` or server close.

    Streams ``text`` (as tokens) first, then sets :attr:`started` and waits. Meant
    for killing a worker while the model streams. On release, ``then`` (a
    :class:`Text`, :class:`ToolCalls` or :class:`Drop`) continues the same
    response; without ``then`` the response ends normally with the ``done`` line.
    On reset or server close the connection is cut abruptly. If the client goes
    away while waiting, :attr:`client_gone` is set and the handler ends.
    """

    text: str = ""
    then: Text | ToolCalls | Drop | None = None
    started: threading.Event = field(default_factory=threading.Event, repr=False)
    released: threading.Event = field(default_factory=threading.Event, repr=False)
    client_gone: threading.Event = field(default_factory=threading.Event, repr=False)
    #: Set when the handler is done with this reply, however it ended.
    finished: threading.Event = field(default_factory=threading.Event, repr=False)
    _cancelled: threading.Event = field(default_factory=threading.Event, repr=False)

    def release(self) -> None:
        self.released.set()

    def wait_started(self, timeout: float = 10.0) -> None:
        if not self.started.wait(timeout):
            raise TimeoutError(f"the model's Hang() reply did not start within {timeout}s")

    async def wait_started_async(self, timeout: float = 10.0) -> None:  # noqa: ASYNC109 - twin of wait_started
        await asyncio.to_thread(self.wait_started, timeout)

    def wait_client_gone(self, timeout: float = 10.0) -> None:
        if not self.client_gone.wait(timeout):
            raise TimeoutError(f"the client of the Hang() reply was still connected after {timeout}s")


@dataclass
class Drop:
    """Send ``after_tokens`` tokens of ``text``, then cut the connection abruptly."""

    after_tokens: int = 0
    text: str = "this reply is cut short by a dropped connection"
    token_delay: float = 0.0


@dataclass
class Status:
    """Answer with a plain HTTP status (no stream). ``body`` dict → JSON, str → text/plain."""

    code: int
    body: dict[str, Any] | str = field(default_factory=lambda: {"error": "scripted failure"})


@dataclass
class StreamError:
    """Answer 200, stream ``after_tokens`` tokens, then an ``{"error": ...}`` line.

    This is how Ollama reports a failure that happens mid-generation; the ollama
    client raises ``ResponseError`` on it.
    """

    message: str = "scripted stream error"
    after_tokens: int = 0
    text: str = "partial answer before the error"


Reply = Text | ToolCalls | Hang | Drop | Status | StreamError


# --- server --------------------------------------------------------------------------


def _normalize_model(name: str) -> str:
    return name if ":" in name else f"{name}:latest"


def _now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class _ClientGone(Exception):
    """The HTTP client closed its connection while we were writing or waiting."""


class _Cut(Exception):
    """We cut the connection on purpose (Drop, or Hang ended by reset/close)."""


class FakeOllama:
    """A local server speaking Ollama's chat protocol, on a background thread.

    Thread-safe; use as a context manager or call :meth:`start` / :meth:`close`.
    ``port=0`` picks a free port; pass a port to restart on the same address.
    """

    def __init__(
        self,
        models: Iterable[str] = ("test-model",),
        *,
        default_text: str = "ok",
        port: int = 0,
    ) -> None:
        self.models = [_normalize_model(m) for m in models]
        self.default_text = default_text
        self._port = port
        self._lock = threading.Lock()
        self._script: list[Reply] = []
        self._routed: dict[str, list[Reply]] = {}
        self._answer: Callable[[dict[str, Any]], Reply | None] | None = None
        self._requests: list[dict[str, Any]] = []
        self._log: list[tuple[str, str]] = []
        self._hangs: list[Hang] = []
        self._changed = threading.Condition(self._lock)
        self._closing = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle

    def start(self) -> FakeOllama:
        if self._server is not None:
            raise RuntimeError("FakeOllama already started")
        self._closing.clear()
        server = _Server(("127.0.0.1", self._port), _Handler)
        server.fake = self
        self._server = server
        self._port = server.server_address[1]
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-ollama", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving. Hanging replies are cut; the port is free again afterwards."""
        server, self._server = self._server, None
        if server is None:
            return
        self._closing.set()
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeOllama:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    # -- script

    def script(self, *replies: Reply) -> FakeOllama:
        """Append replies to the script (consumed in order, one per chat request)."""
        with self._lock:
            self._script.extend(replies)
        return self

    def script_for(self, marker: str, *replies: Reply) -> FakeOllama:
        """Replies for one conversation only: a request whose first user message contains
        ``marker`` takes them, in order, before the shared script. For runs that ask the
        model at the same time, where the order of the shared script is a race."""
        with self._lock:
            self._routed.setdefault(marker, []).extend(replies)
        return self

    def answer_by(self, answer: Callable[[dict[str, Any]], Reply | None] | None) -> FakeOllama:
        """Reply by what is asked: ``answer(request body)`` is consulted first, and its
        reply (unless None) is sent. A request made twice gets the same reply: for a run
        killed while the model answered, which asks again after the restart."""
        with self._lock:
            self._answer = answer
        return self

    @property
    def pending(self) -> int:
        """Replies scripted but not consumed yet (routed ones included)."""
        with self._lock:
            return len(self._script) + sum(map(len, self._routed.values()))

    def reset(self) -> None:
        """Clear the script and the records; cut any reply still hanging."""
        with self._lock:
            self._script.clear()
            self._routed.clear()
            self._answer = None
            self._requests.clear()
            self._log.clear()
            hangs, self._hangs = self._hangs, []
        for hang in hangs:
            hang._cancelled.set()

    def _next_reply(self) -> Reply:
        with self._lock:
            return self._script.pop(0) if self._script else Text(self.default_text)

    def _routed_reply(self, body: dict[str, Any]) -> Reply | None:
        answer = self._answer
        if answer is not None and (reply := answer(body)) is not None:
            return reply
        if not self._routed:
            return None
        first = next((m for m in body.get("messages") or [] if m.get("role") == "user"), None)
        content = str(first.get("content", "")) if first else ""
        with self._lock:
            for marker, replies in self._routed.items():
                if marker in content and replies:
                    return replies.pop(0)
        return None

    # -- records

    @property
    def requests(self) -> list[dict[str, Any]]:
        """Parsed JSON bodies of every ``POST /api/chat``, oldest first (a copy)."""
        with self._lock:
            return list(self._requests)

    @property
    def calls(self) -> int:
        """Number of ``POST /api/chat`` requests received (unknown models included)."""
        with self._lock:
            return len(self._requests)

    @property
    def request_log(self) -> list[tuple[str, str]]:
        """``(method, path)`` of every request, any endpoint."""
        with self._lock:
            return list(self._log)

    def wait_for_calls(self, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        """Block until at least ``n`` chat requests arrived; return the requests."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self._requests) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"fake model got {len(self._requests)} chat request(s), "
                        f"expected {n} within {timeout}s"
                    )
                self._changed.wait(left)
            return list(self._requests)

    async def wait_for_calls_async(
        self,
        n: int,
        timeout: float = 10.0,  # noqa: ASYNC109 - same signature as wait_for_calls
    ) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self.wait_for_calls, n, timeout)

    def _record(self, method: str, path: str, body: dict[str, Any] | None) -> None:
        with self._changed:
            self._log.append((method, path))
            if body is not None:
                self._requests.append(body)
            self._changed.notify_all()

    def _track_hang(self, hang: Hang) -> None:
        with self._lock:
            self._hangs.append(hang)

    def knows(self, model: str) -> bool:
        return _normalize_model(model) in self.models


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    fake: FakeOllama

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that goes away mid-stream is normal in crash tests; stay quiet.
        import sys

        exc = sys.exc_info()[1]
        if isinstance(exc, OSError | _ClientGone | _Cut):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # One small write per line: without TCP_NODELAY, Nagle and delayed ACKs add
    # ~40 ms per response (Ollama, in Go, sets TCP_NODELAY too).
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # -- plumbing

    @property
    def fake(self) -> FakeOllama:
        return self.server.fake

    def _read_json(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return {}
        return json.loads(raw)

    def _send_json(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_text(self, code: int, text: str) -> None:
        data = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _line(self, obj: dict[str, Any]) -> None:
        data = json.dumps(obj).encode() + b"\n"
        try:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
        except OSError as exc:
            raise _ClientGone from exc

    def _end_stream(self) -> None:
        try:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError as exc:
            raise _ClientGone from exc

    def _cut(self) -> None:
        """Close the socket without finishing the chunked body: the client sees a broken stream."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)
        raise _Cut

    # -- chat stream pieces

    def _chunk(self, model: str, content: str = "", **message: Any) -> dict[str, Any]:
        return {
            "model": model,
            "created_at": _now_iso(),
            "message": {"role": "assistant", "content": content, **message},
            "done": False,
        }

    def _tokens(self, model: str, pieces: Iterable[str], delay: float = 0.0) -> int:
        n = 0
        for piece in pieces:
            if delay:
                time.sleep(delay)
            self._line(self._chunk(model, piece))
            n += 1
        return n

    def _done(self, model: str, eval_count: int, prompt_eval_count: int) -> None:
        self._line(
            {
                "model": model,
                "created_at": _now_iso(),
                "message": {"role": "assistant", "content": ""},
                "done": True,
                "done_reason": "stop",
                "total_duration": 1_000_000 * (1 + eval_count),
                "load_duration": 100_000,
                "prompt_eval_count": prompt_eval_count,
                "prompt_eval_duration": 200_000,
                "eval_count": eval_count,
                "eval_duration": 1_000_000 * eval_count,
            }
        )
        self._end_stream()

    # -- routes

    def do_GET(self) -> None:
        self.fake._record("GET", self.path, None)
        if self.path in ("/", ""):
            self._send_text(200, "Ollama is running")
        elif self.path == "/api/version":
            self._send_json(200, {"version": "0.0.0-fake"})
        elif self.path == "/api/tags":
            self._send_json(200, {"models": [_tag_entry(m) for m in self.fake.models]})
        elif self.path == "/api/ps":
            self._send_json(200, {"models": []})
        else:
            self._send_text(404, "404 page not found")

    def do_HEAD(self) -> None:
        self.fake._record("HEAD", self.path, None)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        try:
            body = self._read_json()
        except (ValueError, UnicodeDecodeError):
            self.fake._record("POST", self.path, None)
            self._send_json(400, {"error": "invalid JSON body"})
            return
        if self.path == "/api/chat":
            self.fake._record("POST", self.path, body if isinstance(body, dict) else {"_raw": body})
            self._chat(body if isinstance(body, dict) else {})
        elif self.path == "/api/show":
            self.fake._record("POST", self.path, None)
            name = str(body.get("model") or body.get("name") or "")
            if not self.fake.knows(name):
                self._send_json(404, {"error": f"model '{name}' not found"})
            else:
                self._send_json(
                    200,
                    {
                        "modelfile": "",
                        "parameters": "",
                        "template": "",
                        "details": _details(),
                        "model_info": {},
                        "capabilities": ["completion", "tools"],
                    },
                )
        else:
            self.fake._record("POST", self.path, None)
            self._send_text(404, "404 page not found")

    def _chat(self, body: dict[str, Any]) -> None:
        model = str(body.get("model") or "")
        if not self.fake.knows(model):
            # Not consuming the script: the request never reached a model.
            self._send_json(404, {"error": f"model '{model}' not found"})
            return
        prompt_eval_count = sum(len(str(m.get("content", ""))) for m in body.get("messages") or [])
        reply = self.fake._routed_reply(body) or self.fake._next_reply()
        if isinstance(reply, Status):
            if isinstance(reply.body, str):
                self._send_text(reply.code, reply.body)
            else:
                self._send_json(reply.code, reply.body)
            return
        self._start_stream()
        self._play(model, reply, prompt_eval_count)

    def _play(self, model: str, reply: Reply, prompt_eval_count: int) -> None:
        if isinstance(reply, Text):
            n = 0
            if reply.thinking:
                self._line(self._chunk(model, "", thinking=reply.thinking))
            n += self._tokens(model, reply.pieces(), reply.token_delay)
            self._done(model, n, prompt_eval_count)
        elif isinstance(reply, ToolCalls):
            n = self._tokens(model, split_tokens(reply.text), reply.token_delay)
            calls = [{"function": {"name": name, "arguments": dict(args)}} for name, args in reply.calls]
            self._line(self._chunk(model, "", tool_calls=calls))
            self._done(model, n + len(calls), prompt_eval_count)
        elif isinstance(reply, Drop):
            self._tokens(model, split_tokens(reply.text)[: reply.after_tokens], reply.token_delay)
            self._cut()
        elif isinstance(reply, StreamError):
            self._tokens(model, split_tokens(reply.text)[: reply.after_tokens])
            self._line({"error": reply.message})
            self._end_stream()
        elif isinstance(reply, Hang):
            self._hang(model, reply, prompt_eval_count)
        else:  # pragma: no cover - Status is handled before the stream starts
            raise TypeError(f"unknown reply {reply!r}")

    def _hang(self, model: str, hang: Hang, prompt_eval_count: int) -> None:
        self.fake._track_hang(hang)
        try:
            n = self._tokens(model, split_tokens(hang.text))
            hang.started.set()
            while not hang.released.is_set():
                if hang._cancelled.is_set() or self.fake._closing.is_set():
                    self._cut()
                if self._client_closed(timeout=0.05):
                    hang.client_gone.set()
                    raise _ClientGone
            if hang.then is None:
                self._done(model, n, prompt_eval_count)
            else:
                self._play(model, hang.then, prompt_eval_count)
        finally:
            hang.finished.set()

    def _client_closed(self, timeout: float) -> bool:
        """True once the peer has closed its end (readable with nothing to read)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], timeout)
            if not readable:
                return False
            if self.connection.recv(1, socket.MSG_PEEK) == b"":
                return True
            time.sleep(timeout)  # the client sent bytes (it should not): do not spin on them
            return False
        except OSError:
            return True


def _details() -> dict[str, Any]:
    return {
        "parent_model": "",
        "format": "gguf",
        "family": "fake",
        "families": ["fake"],
        "parameter_size": "0B",
        "quantization_level": "Q0",
    }


def _tag_entry(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "model": name,
        "modified_at": "2025-01-01T00:00:00Z",
        "size": 1,
        "digest": "0" * 64,
        "details": _details(),
    }
