"""The benchmark's HTTP client: what a user of the API does, timed.

A lean HTTP/1.1 client on asyncio streams (keep-alive, chunked bodies) rather
than httpx: on this 2-core machine every millisecond of CPU the clients spend is
taken from the service they measure, and httpx's per-chunk cost on an event
stream is several times that of the whole parse here. Events are parsed by the
test harness's ``SseParser``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

from bench.model_server import ANSWER_TOKENS, TOOL_ARGUMENTS
from tests.support.client import SseEvent, SseParser

#: how long the rest of a stream may take to arrive after its terminal event
DRAIN_SECONDS = 5.0


class BenchError(RuntimeError):
    """The service did not do what the workload expects (a functional failure, not a slow one)."""


class Connection:
    """One keep-alive HTTP/1.1 connection; one request at a time."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.writer is None or self.reader is None or self.writer.is_closing() or self.reader.at_eof():
            await self.close()
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        return self.reader, self.writer

    async def close(self) -> None:
        writer, self.writer, self.reader = self.writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _request(
        self, method: str, target: str, body: bytes | None, accept: str
    ) -> tuple[int, dict[str, str]]:
        reader, writer = await self._open()
        head = f"{method} {target} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nAccept: {accept}\r\n"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        writer.write(head.encode() + b"\r\n" + (body or b""))
        status_line = await reader.readline()
        if not status_line:
            raise ConnectionError("the server closed the connection")
        status = int(status_line.split()[1])
        headers: dict[str, str] = {}
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        return status, headers

    async def _chunks(self, headers: dict[str, str]) -> AsyncIterator[bytes]:
        assert self.reader is not None
        reader = self.reader
        if headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    break
                yield (await reader.readexactly(size + 2))[:-2]
        elif "content-length" in headers:
            yield await reader.readexactly(int(headers["content-length"]))
        else:
            yield await reader.read()
            await self.close()
            return
        if headers.get("connection", "").lower() == "close":
            await self.close()

    async def json(self, method: str, target: str, body: Any = None) -> tuple[int, Any]:
        try:
            status, headers = await self._request(
                method, target, None if body is None else json.dumps(body).encode(), "application/json"
            )
            raw = b"".join([chunk async for chunk in self._chunks(headers)])
        except BaseException:
            await self.close()
            raise
        return status, json.loads(raw) if raw else None

    @contextlib.asynccontextmanager
    async def events(self, target: str) -> AsyncIterator[AsyncIterator[SseEvent]]:
        """An event stream; leaving it reads the stream's end (or drops the connection)."""
        try:
            status, headers = await self._request("GET", target, None, "text/event-stream")
        except BaseException:
            await self.close()
            raise
        chunks = self._chunks(headers)
        if status != 200:
            raw = b"".join([c async for c in chunks])
            raise BenchError(f"GET {target.split('?')[0]}: {status} {raw[:500].decode(errors='replace')}")

        async def parse() -> AsyncIterator[SseEvent]:
            parser = SseParser()
            rest = ""
            async for chunk in chunks:
                lines = (rest + chunk.decode()).split("\n")
                rest = lines.pop()
                for line in lines:
                    event = parser.feed(line.removesuffix("\r"))
                    if event is not None:
                        yield event

        clean = False
        try:
            yield parse()
            # The terminal event was the last one: the stream's closing chunk follows at once.
            async with asyncio.timeout(DRAIN_SECONDS):
                async for _ in chunks:
                    pass
            clean = True
        finally:
            if not clean:
                await self.close()


class Client:
    """Connections to the API, reused one request after another."""

    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self._idle: list[Connection] = []
        self._all: list[Connection] = []

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Connection]:
        conn = self._idle.pop() if self._idle else Connection(self.host, self.port)
        if conn not in self._all:
            self._all.append(conn)
        try:
            yield conn
        finally:
            self._idle.append(conn)

    async def aclose(self) -> None:
        for conn in self._all:
            await conn.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def http_client(base_url: str, *, connections: int = 0) -> Client:
    """(``connections`` is not a limit: a connection is opened whenever none is idle.)"""
    return Client(base_url)


def stream_target(conversation: str) -> str:
    return "/api/chat?" + urlencode({"conversation": conversation})


@contextlib.asynccontextmanager
async def sse(client: Client, conversation: str) -> AsyncIterator[AsyncIterator[SseEvent]]:
    """``GET /api/chat?conversation=`` as an async iterator of events (pings skipped)."""
    async with client.connection() as conn, conn.events(stream_target(conversation)) as events:
        yield events


@dataclass(frozen=True, slots=True)
class ServiceRun:
    conversation: str
    run: str
    #: time.time() just before the POST was sent
    sent_at: float
    #: time.time() when ``end`` was parsed
    ended_at: float
    post_ms: float
    first_event_ms: float
    first_token_ms: float
    total_ms: float


async def chat_once(client: Client, message: str, conversation: str | None = None) -> ServiceRun:
    """POST a message, then read the run's events until ``end``; check the workload happened."""
    body: dict[str, Any] = {"message": message}
    if conversation is not None:
        body["conversation"] = conversation
    async with client.connection() as conn:
        sent_at = time.time()
        started = time.perf_counter()
        status, accepted = await conn.json("POST", "/api/chat", body)
        posted = time.perf_counter()
        if status != 202:
            raise BenchError(f"POST /api/chat: {status} {str(accepted)[:500]}")
        first_event = first_token = ended = 0.0
        ended_at = 0.0
        tokens: list[str] = []
        tool_results = 0
        end: SseEvent | None = None
        async with conn.events(stream_target(accepted["conversation"])) as events:
            async for event in events:
                now = time.perf_counter()
                first_event = first_event or now
                if event.event == "token":
                    first_token = first_token or now
                    tokens.append(event.data)
                elif (
                    event.event == "trace"
                    and isinstance(event.data, dict)
                    and event.data.get("event") == "result"
                ):
                    # The tool must have run: a tool server that is down gives an error result.
                    result = event.data.get("data") or {}
                    if result.get("status") != "success" or result.get("result") != TOOL_ARGUMENTS["text"]:
                        raise BenchError(f"run {accepted['run']}: the tool did not run: {event.raw[:500]}")
                    tool_results += 1
                elif event.event == "end":
                    ended, ended_at, end = now, time.time(), event
                    break
                elif event.event in ("chat-error", "missed"):
                    raise BenchError(f"run {accepted['run']}: {event.event} {event.raw[:500]}")
    if end is None:
        raise BenchError(f"run {accepted['run']}: the stream closed before its end event")
    if end.data.get("run") != accepted["run"]:
        raise BenchError(f"streamed run {end.data.get('run')}, expected {accepted['run']}")
    if tool_results != 1 or "".join(tokens) != "".join(ANSWER_TOKENS):
        raise BenchError(
            f"run {accepted['run']}: expected one tool result and the 20-token answer, "
            f"got {tool_results} result(s) and {''.join(tokens)!r}"
        )
    return ServiceRun(
        conversation=accepted["conversation"],
        run=accepted["run"],
        sent_at=sent_at,
        ended_at=ended_at,
        post_ms=(posted - started) * 1000,
        first_event_ms=(first_event - started) * 1000,
        first_token_ms=(first_token - started) * 1000,
        total_ms=(ended - started) * 1000,
    )
