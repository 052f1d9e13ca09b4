"""The HTTP calls the command-line client makes (httpx, httpx-sse)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
from httpx_sse import ServerSentEvent, connect_sse

#: reconnections of one event stream in a row before giving up (each resumes with Last-Event-ID);
#: with the delays below, about 40 s: long enough for `./sophos up` to restart the API
RECONNECTS = 20
RECONNECT_FIRST_DELAY = 0.25
RECONNECT_MAX_DELAY = 2.0


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

    @property
    def terminal(self) -> bool:
        return self.type in ("end", "chat-error")


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

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise Unreachable(f"cannot reach the API at {self.url}: {exc}") from exc
        _raise_for(response)
        return response

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._send(method, path, **kwargs).json()

    def chat(
        self, message: str | None, conversation: str | None, resume: bool, assistant: str | None = None
    ) -> dict[str, str]:
        body: dict[str, Any] = {}
        if resume:
            body["resume"] = True
        else:
            body["message"] = message
        if conversation:
            body["conversation"] = conversation
        elif assistant:
            body["assistant"] = assistant  # a new conversation's; it keeps it
        result: dict[str, str] = self._call("POST", "/api/chat", json=body)
        return result

    def regenerate(self, conversation: str, message: str) -> dict[str, Any]:
        """Another answer to the user message ``message`` is (or answers): a fork of the thread."""
        result: dict[str, Any] = self._call(
            "POST", "/api/chat", json={"conversation": conversation, "regenerate": message}
        )
        return result

    def decide(self, conversation: str, decisions: list[dict[str, Any]]) -> dict[str, str]:
        """One decision per pending request: ``{id, action, arguments?, message?}``."""
        body = {"conversation": conversation, "decisions": decisions}
        result: dict[str, str] = self._call("POST", "/api/chat", json=body)
        return result

    def whoami(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/api/whoami")
        return result

    def runs(self, **params: Any) -> dict[str, Any]:
        result: dict[str, Any] = self._call(
            "GET", "/api/runs", params={k: v for k, v in params.items() if v is not None}
        )
        return result

    def run(self, run_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/api/runs/{run_id}")
        return result

    def cancel(self, run_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/api/runs/{run_id}/cancel")
        return result

    def conversations(self, limit: int | None = None, cursor: str | None = None) -> dict[str, Any]:
        """One page: ``{conversations, nextCursor?}`` (an API without paging answers them all)."""
        params = {k: v for k, v in {"limit": limit, "cursor": cursor}.items() if v is not None}
        result: dict[str, Any] = self._call("GET", "/api/conversations", params=params)
        return result

    def conversation(self, conversation_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/api/conversations/{conversation_id}")
        return result

    def export(self, conversation_id: str, jsonl: bool) -> bytes:
        params = {"format": "jsonl"} if jsonl else {}
        return self._send("GET", f"/api/conversations/{conversation_id}/export", params=params).content

    def rename(self, conversation_id: str, title: str) -> tuple[int, dict[str, Any]]:
        """200: renamed; 202: the worker writes the title when it takes the job."""
        response = self._send("PATCH", f"/api/conversations/{conversation_id}", json={"title": title})
        body: dict[str, Any] = response.json()
        return response.status_code, body

    def delete(self, conversation_id: str) -> int:
        """204: deleted; 202: the worker deletes it when it takes the job."""
        return self._send("DELETE", f"/api/conversations/{conversation_id}").status_code

    def prune(self) -> dict[str, Any]:
        """Start pruning old checkpoints (operators): the job and its progress so far."""
        result: dict[str, Any] = self._call("POST", "/api/checkpoints/prune")
        return result

    def prune_progress(self, job: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/api/checkpoints/prune/{job}")
        return result

    def stream(self, conversation: str, run: str | None = None) -> EventStream:
        return EventStream(self, conversation, run)


class EventStream:
    """A run's events until its terminal one, across reconnections.

    ``last_id`` outlives an iteration cut short (Ctrl-C while reading): iterating
    again resumes after the last event seen, nothing missed and nothing twice.
    """

    def __init__(self, api: Api, conversation: str, run: str | None = None) -> None:
        self.api = api
        self.conversation = conversation
        self.run = run
        self.last_id: str | None = None
        self.finished = False
        #: called with a reason when the connection is lost, and with None once it is back
        self.on_connection: Callable[[str | None], None] = lambda _: None

    def __iter__(self) -> Iterator[Event]:
        failures = 0
        lost = False
        params = {"conversation": self.conversation, **({"run": self.run} if self.run else {})}
        while not self.finished:
            headers = {"Last-Event-ID": self.last_id} if self.last_id else {}
            reason: str
            try:
                with connect_sse(self.api.http, "GET", "/api/chat", params=params, headers=headers) as source:
                    if source.response.status_code == 204:
                        self.finished = True  # we have seen the terminal event already
                        return
                    if not source.response.is_success:
                        source.response.read()
                        _raise_for(source.response)
                    if lost:
                        lost = False
                        self.on_connection(None)
                    for sse in source.iter_sse():
                        event = _event(sse)
                        failures = 0
                        if event.id is not None:
                            self.last_id = event.id
                        if event.terminal:
                            self.finished = True
                        yield event
                        if self.finished:
                            return
                reason = "the API closed the event stream before the run ended"
            except httpx.TransportError as exc:
                reason = f"lost the API at {self.api.url} ({type(exc).__name__})"
            except ApiError as exc:
                if exc.status < 500:
                    raise
                reason = f"the API answered {exc.status} {exc.code}"
            failures += 1
            if failures > RECONNECTS:
                raise Unreachable(f"{reason}; gave up after {RECONNECTS} reconnections")
            if not lost:
                lost = True
                self.on_connection(reason)
            time.sleep(min(RECONNECT_MAX_DELAY, RECONNECT_FIRST_DELAY * 2 ** (failures - 1)))
