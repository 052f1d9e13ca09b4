"""The HTTP calls the command-line client makes (httpx, httpx-sse)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
from httpx_sse import ServerSentEvent, connect_sse

#: reconnections of one event stream before giving up (each resumes with Last-Event-ID)
RECONNECTS = 5


class ApiError(Exception):
    """The API answered with its error envelope (or something else that is not success)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class Unreachable(Exception):
    """The API could not be reached at all."""


@dataclass(frozen=True, slots=True)
class Event:
    id: str | None
    type: str
    data: Any


def _raise_for(response: httpx.Response) -> None:
    if response.is_success:
        return
    try:
        error = response.json()["error"]
        code, message = str(error["code"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        code, message = f"HTTP_{response.status_code}", response.text[:200] or response.reason_phrase
    raise ApiError(response.status_code, code, message)


def _event(sse: ServerSentEvent) -> Event:
    try:
        data = json.loads(sse.data) if sse.data else None
    except ValueError:
        data = sse.data
    return Event(id=sse.id or None, type=sse.event, data=data)


class Api:
    def __init__(self, url: str, token: str | None = None, timeout: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # Event streams stay open while the model thinks: no read timeout on them.
        self.http = httpx.Client(
            base_url=url.rstrip("/"), headers=headers, timeout=httpx.Timeout(timeout, read=None)
        )
        self.url = url

    def close(self) -> None:
        self.http.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise Unreachable(f"cannot reach the API at {self.url}: {exc}") from exc
        _raise_for(response)
        return response.json()

    def chat(self, message: str | None, conversation: str | None, resume: bool) -> dict[str, str]:
        body: dict[str, Any] = {}
        if resume:
            body["resume"] = True
        else:
            body["message"] = message
        if conversation:
            body["conversation"] = conversation
        result: dict[str, str] = self._call("POST", "/api/chat", json=body)
        return result

    def runs(self, **params: Any) -> dict[str, Any]:
        result: dict[str, Any] = self._call(
            "GET", "/api/runs", params={k: v for k, v in params.items() if v is not None}
        )
        return result

    def cancel(self, run_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/api/runs/{run_id}/cancel")
        return result

    def events(self, conversation: str) -> Iterator[Event]:
        """The conversation's current run's events until its terminal one, reconnecting as needed."""
        last_id: str | None = None
        failures = 0
        while True:
            headers = {"Last-Event-ID": last_id} if last_id else {}
            try:
                with connect_sse(
                    self.http, "GET", "/api/chat", params={"conversation": conversation}, headers=headers
                ) as source:
                    if source.response.status_code == 204:
                        return  # we have seen the terminal event already
                    if not source.response.is_success:
                        source.response.read()
                        _raise_for(source.response)
                    for sse in source.iter_sse():
                        event = _event(sse)
                        failures = 0
                        if event.id is not None:
                            last_id = event.id
                        yield event
                        if event.type in ("end", "chat-error"):
                            return
            except httpx.TransportError as exc:
                failures += 1
                if failures > RECONNECTS:
                    raise Unreachable(f"the event stream kept failing: {exc}") from exc
            else:
                failures += 1  # the server closed the stream early (e.g. it is shutting down)
                if failures > RECONNECTS:
                    raise Unreachable("the event stream kept closing before the run ended")
            time.sleep(min(2.0, 0.2 * 2**failures))
