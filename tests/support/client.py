"""Small HTTP helpers for talking to the API the way a client does.

Synchronous helpers block the event loop of an async test; use the ``*_async``
twins when something else (a reader task, a second request) must run meanwhile.
The SSE reader is written by hand rather than with httpx-sse so it can count the
keep-alive comment lines (pings), which httpx-sse drops silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, overload

import httpx

from tests.support.http import async_http_client, http_client

T = TypeVar("T")

TERMINAL_EVENTS = frozenset({"end", "chat-error"})

#: The default bound of a request or a wait: generous, because the real-process tiers share
#: two cores between several xdist workers and their services (tests/support/tiers.py). Only
#: a failing test ever waits this long; a test that means a shorter bound passes its own.
DEFAULT_TIMEOUT = 30.0


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def chat_body(
    message: str | None = None, conversation: str | None = None, resume: bool = False
) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if message is not None:
        body["message"] = message
    if conversation is not None:
        body["conversation"] = conversation
    if resume:
        body["resume"] = True
    return body


def post_chat(
    api_url: str,
    message: str | None = None,
    conversation: str | None = None,
    resume: bool = False,
    *,
    token: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> httpx.Response:
    """``POST /api/chat``; fields left as None are not sent. Returns the response as is."""
    with http_client(base_url=api_url, timeout=timeout) as http:
        return http.post("/api/chat", json=chat_body(message, conversation, resume), headers=_headers(token))


async def post_chat_async(
    api_url: str,
    message: str | None = None,
    conversation: str | None = None,
    resume: bool = False,
    *,
    token: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,  # noqa: ASYNC109 - same signature as post_chat
) -> httpx.Response:
    async with async_http_client(base_url=api_url, timeout=timeout) as http:
        return await http.post(
            "/api/chat", json=chat_body(message, conversation, resume), headers=_headers(token)
        )


def chat(
    api_url: str,
    message: str | None = None,
    conversation: str | None = None,
    resume: bool = False,
    *,
    token: str | None = None,
) -> tuple[str, str]:
    """``POST /api/chat``, assert 202, return ``(conversation, run)``."""
    response = post_chat(api_url, message, conversation, resume, token=token)
    assert response.status_code == 202, response.text
    body = response.json()
    return body["conversation"], body["run"]


async def chat_async(
    api_url: str,
    message: str | None = None,
    conversation: str | None = None,
    resume: bool = False,
    *,
    token: str | None = None,
) -> tuple[str, str]:
    """:func:`chat` for async tests."""
    response = await post_chat_async(api_url, message, conversation, resume, token=token)
    assert response.status_code == 202, response.text
    body = response.json()
    return body["conversation"], body["run"]


def get_json(
    api_url: str,
    path: str,
    *,
    token: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    expect: int = 200,
    raw: bool = False,
    **params: Any,
) -> Any:
    """GET ``path``, assert the status (200 unless ``expect``), return the parsed body
    (or its text when ``raw``)."""
    with http_client(base_url=api_url, timeout=timeout) as http:
        response = http.get(path, params=params or None, headers=_headers(token))
    assert response.status_code == expect, f"GET {path}: {response.status_code} {response.text}"
    return response.text if raw else response.json()


# --- Server-Sent Events ---------------------------------------------------------------


@dataclass(frozen=True)
class SseEvent:
    id: str | None
    event: str
    #: ``raw`` parsed as JSON; ``raw`` itself when it is not JSON.
    data: Any
    raw: str

    @property
    def terminal(self) -> bool:
        return self.event in TERMINAL_EVENTS


class SseEvents(list[SseEvent]):
    """The events read from one SSE response, in order, plus what else was seen."""

    pings: int = 0
    status_code: int = 0
    #: True when the stream was closed after a terminal event (``end``/``chat-error``).
    ended: bool = False
    #: True when the reader gave up on ``stop_after`` (a client cut off on purpose).
    cut: bool = False
    #: True when the server closed or broke the stream before a terminal event.
    dropped: bool = False

    @property
    def last_id(self) -> str | None:
        for event in reversed(self):
            if event.id is not None:
                return event.id
        return None

    @property
    def ids(self) -> list[str | None]:
        return [e.id for e in self]

    @property
    def types(self) -> list[str]:
        return [e.event for e in self]

    def of(self, event: str) -> list[SseEvent]:
        return [e for e in self if e.event == event]

    @property
    def text(self) -> str:
        """The assistant text: every ``token`` event's data, concatenated."""
        return "".join(e.data for e in self if e.event == "token")

    @property
    def terminal(self) -> SseEvent | None:
        return self[-1] if self and self[-1].terminal else None


class SseError(AssertionError):
    """The SSE endpoint did not answer 200 ``text/event-stream``."""

    def __init__(self, response: httpx.Response, body: str) -> None:
        super().__init__(f"GET /api/chat: {response.status_code} {body[:2000]}")
        self.status_code = response.status_code
        self.body = body


class SseTimeout(TimeoutError):
    def __init__(self, timeout: float, events: SseEvents) -> None:
        super().__init__(
            f"SSE stream not finished after {timeout}s: {len(events)} events "
            f"({', '.join(events.types[-10:])}), {events.pings} pings"
        )
        self.events = events


class SseDropped(ConnectionError):
    def __init__(self, events: SseEvents, cause: BaseException | None) -> None:
        super().__init__(
            f"SSE stream closed before a terminal event ({cause!r}): {len(events)} events "
            f"({', '.join(events.types[-10:])}); pass allow_drop=True if that is expected"
        )
        self.events = events


#: What httpx raises when the server goes away mid-stream.
_DROP_ERRORS = (httpx.RemoteProtocolError, httpx.ReadError)


class SseParser:
    """Incremental parser of ``text/event-stream`` lines (the WHATWG rules we need)."""

    def __init__(self) -> None:
        self.pings = 0
        self._id: str | None = None
        self._event = ""
        self._data: list[str] = []

    def feed(self, line: str) -> SseEvent | None:
        """Feed one line (without its newline); return an event when one is complete."""
        if line == "":
            if not self._data:
                self._event = ""
                return None
            raw = "\n".join(self._data)
            try:
                data = json.loads(raw)
            except ValueError:
                data = raw
            event = SseEvent(id=self._id, event=self._event or "message", data=data, raw=raw)
            self._event, self._data = "", []
            # The id is not carried to the next event: ours must name their own.
            self._id = None
            return event
        if line.startswith(":"):
            self.pings += 1
            return None
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\x00" not in value:
            self._id = value
        return None

    def feed_lines(self, lines: Iterable[str]) -> Iterator[SseEvent]:
        for line in lines:
            event = self.feed(line)
            if event is not None:
                yield event


def _sse_request(
    conversation: str, last_event_id: str | int | None, via_query: bool, token: str | None,
    run: str | None = None,
) -> tuple[dict[str, str], dict[str, str]]:
    params = {"conversation": conversation}
    if run is not None:
        params["run"] = run
    headers = {"Accept": "text/event-stream", **_headers(token)}
    if last_event_id is not None:
        if via_query:
            params["lastEventId"] = str(last_event_id)
        else:
            headers["Last-Event-ID"] = str(last_event_id)
    return params, headers


def _check_sse_response(response: httpx.Response, body: str) -> None:
    content_type = response.headers.get("content-type", "")
    if response.status_code != 200 or not content_type.startswith("text/event-stream"):
        raise SseError(response, body)


def read_sse(
    api_url: str,
    conversation: str,
    last_event_id: str | int | None = None,
    *,
    via_query: bool = False,
    timeout: float = 30.0,
    stop_after: int | None = None,
    token: str | None = None,
    raise_on_timeout: bool = True,
    allow_drop: bool = False,
) -> SseEvents:
    """Read ``GET /api/chat?conversation=`` until ``end``/``chat-error``.

    ``stop_after=n`` closes the connection after n events (a client cut off).
    After ``timeout`` seconds without a terminal event: :class:`SseTimeout`
    (carrying the events so far), or the events so far if ``raise_on_timeout`` is
    false. The deadline is checked per line, so one silent read can overrun it by
    up to ``timeout`` (pings keep the lines coming). Non-200: :class:`SseError`.
    A stream that the server closes or breaks before a terminal event raises
    :class:`SseDropped`, or with ``allow_drop`` returns the events with ``.dropped``
    set (an API process killed mid-stream; reconnect with ``events.last_id``).
    """
    params, headers = _sse_request(conversation, last_event_id, via_query, token)
    events = SseEvents()
    parser = SseParser()
    deadline = time.monotonic() + timeout
    http_timeout = httpx.Timeout(timeout, connect=5.0)
    try:
        with (
            http_client(base_url=api_url, timeout=http_timeout) as http,
            http.stream("GET", "/api/chat", params=params, headers=headers) as response,
        ):
            events.status_code = response.status_code
            if response.status_code != 200:
                _check_sse_response(response, response.read().decode(errors="replace"))
            _check_sse_response(response, "")
            for line in response.iter_lines():
                event = parser.feed(line)
                events.pings = parser.pings
                if event is not None:
                    events.append(event)
                    if event.terminal:
                        events.ended = True
                        return events
                    if stop_after is not None and len(events) >= stop_after:
                        events.cut = True
                        return events
                if time.monotonic() > deadline:
                    break
            else:
                return _dropped(events, None, allow_drop)
    except httpx.ReadTimeout:
        pass
    except _DROP_ERRORS as exc:
        return _dropped(events, exc, allow_drop)
    if raise_on_timeout:
        raise SseTimeout(timeout, events)
    return events


def _dropped(events: SseEvents, cause: BaseException | None, allow_drop: bool) -> SseEvents:
    events.dropped = True
    if not allow_drop:
        raise SseDropped(events, cause)
    return events


async def read_sse_async(
    api_url: str,
    conversation: str,
    last_event_id: str | int | None = None,
    *,
    via_query: bool = False,
    run: str | None = None,
    timeout: float = 30.0,  # noqa: ASYNC109 - same signature as read_sse
    stop_after: int | None = None,
    until: Callable[[SseEvents], bool] | None = None,
    on_event: Callable[[SseEvent], None] | None = None,
    on_open: Callable[[], None] | None = None,
    token: str | None = None,
    raise_on_timeout: bool = True,
    raise_on_status: bool = True,
    allow_drop: bool = False,
    http: httpx.AsyncClient | None = None,
) -> SseEvents:
    """:func:`read_sse` for async tests; the deadline is exact.

    Beyond :func:`read_sse`: ``run`` names the run to follow; ``until(events)`` cuts the
    connection once it holds (like ``stop_after``); ``on_event`` sees each event as it is
    parsed (latency measurements); ``on_open()`` is called once the server has answered 200
    (the server-side stream is open); ``raise_on_status=False`` returns an answer other than
    200 as empty events with its ``status_code`` (a 204 for a client past the end); ``http``
    reuses the caller's client (its connection limits) instead of one of its own.
    """
    params, headers = _sse_request(conversation, last_event_id, via_query, token, run)
    events = SseEvents()
    parser = SseParser()

    async def consume(client: httpx.AsyncClient) -> None:
        async with client.stream("GET", "/api/chat", params=params, headers=headers) as response:
            events.status_code = response.status_code
            if response.status_code != 200:
                body = (await response.aread()).decode(errors="replace")
                if not raise_on_status:
                    return
                _check_sse_response(response, body)
            _check_sse_response(response, "")
            if on_open is not None:
                on_open()
            async for line in response.aiter_lines():
                event = parser.feed(line)
                events.pings = parser.pings
                if event is not None:
                    events.append(event)
                    if on_event is not None:
                        on_event(event)
                    if event.terminal:
                        events.ended = True
                        return
                    if (stop_after is not None and len(events) >= stop_after) or (
                        until is not None and until(events)
                    ):
                        events.cut = True
                        return
        _dropped(events, None, allow_drop)

    async def consume_with_own_client() -> None:
        if http is not None:
            await consume(http)
            return
        async with async_http_client(
            base_url=api_url, timeout=httpx.Timeout(None, connect=5.0), trust_env=False
        ) as client:
            await consume(client)

    try:
        async with asyncio.timeout(timeout):
            await consume_with_own_client()
    except _DROP_ERRORS as exc:
        return _dropped(events, exc, allow_drop)
    except TimeoutError:
        if raise_on_timeout:
            raise SseTimeout(timeout, events) from None
    return events


# --- waiting ------------------------------------------------------------------------------


#: Polls of :func:`wait_for` come every ``interval`` for the first second, then further apart, by
#: half each time, up to this: a long wait polled 20 times a second (each poll most often a request
#: to the API, which logs it) cost the CPU-bound real-process tier CPU that the services needed.
POLL_CAP = 0.25
STEADY_FOR = 1.0


def poll_intervals(interval: float) -> Iterator[float]:
    """The sleeps between polls, ``interval`` first (a caller's longer interval is kept as it is)."""
    started = time.monotonic()
    while True:
        yield interval
        if time.monotonic() - started >= STEADY_FOR and interval < POLL_CAP:
            interval = min(POLL_CAP, interval * 1.5)


def wait_for(
    predicate: Callable[[], T],
    timeout: float = DEFAULT_TIMEOUT,
    *,
    interval: float = 0.05,
    message: str | Callable[[], str] = "condition",
) -> T:
    """Call ``predicate`` until it returns something truthy; return that. Bounded by ``timeout``;
    polled every ``interval`` for a second, then less often (:func:`poll_intervals`)."""
    deadline = time.monotonic() + timeout
    sleeps = poll_intervals(interval)
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            text = message() if callable(message) else message
            raise TimeoutError(f"timed out after {timeout}s waiting for {text} (last value {value!r})")
        time.sleep(next(sleeps))


@overload
async def wait_for_async(
    predicate: Callable[[], Awaitable[T]],
    timeout: float = ...,  # noqa: ASYNC109
    *,
    interval: float = ...,
    message: str | Callable[[], str] = ...,
) -> T: ...


@overload
async def wait_for_async(
    predicate: Callable[[], T],
    timeout: float = ...,  # noqa: ASYNC109
    *,
    interval: float = ...,
    message: str | Callable[[], str] = ...,
) -> T: ...


async def wait_for_async(
    predicate: Callable[[], Any],
    timeout: float = DEFAULT_TIMEOUT,  # noqa: ASYNC109 - same signature as wait_for
    *,
    interval: float = 0.05,
    message: str | Callable[[], str] = "condition",
) -> Any:
    """:func:`wait_for` for async tests; ``predicate`` may be a coroutine function."""
    deadline = time.monotonic() + timeout
    sleeps = poll_intervals(interval)
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            text = message() if callable(message) else message
            raise TimeoutError(f"timed out after {timeout}s waiting for {text} (last value {value!r})")
        await asyncio.sleep(next(sleeps))


# --- the fake tools' execution log --------------------------------------------------------


def tool_log(path: str | Path) -> list[dict[str, Any]]:
    """Entries written by tests/fakes/tools_server.py (one per call, plus slow's ``done``)."""
    entries = []
    with contextlib.suppress(FileNotFoundError):
        for line in Path(path).read_text().splitlines():
            if line.strip():
                entries.append(json.loads(line))
    return entries


def tool_calls(path: str | Path, tool: str | None = None) -> list[dict[str, Any]]:
    """Only the call entries (not ``done`` markers), optionally of one tool."""
    return [e for e in tool_log(path) if "args" in e and (tool is None or e["tool"] == tool)]
