"""The SDK's thread streaming session (``client.threads.stream``): commands and event streams.

``POST /threads/{id}/commands`` takes one command, ``{"id", "method", "params"}``:

* ``run.start`` (``{assistant_id, input, config?, metadata?}``) creates a run on the thread as
  ``runs.create`` does (``ProtocolRuns.create``: the same checks, queue, owner and crash
  semantics; the thread created when it does not exist yet, as the SDK mints its id);
* ``input.respond`` (``{interrupt_id, namespace, response}``) answers a pending interrupt with
  ``response`` as ``command.resume`` of that interrupt (``{"decisions": [...]}``): a new run, as
  ``runs.create`` with a command;

and answers ``{"type": "success", "id", "result": {"run_id"}, "meta": {"applied_through_seq"}}``
(``applied_through_seq``: just before the run's first event, so a stream opened ``since`` it
gets the run whole). A command the protocol names but Sophos does not serve is answered
``{"type": "error", "error": "not_supported", ...}``; the errors of creating a run (404, 409,
422, 429) are the HTTP errors ``runs.create`` answers.

``POST /threads/{id}/stream/events`` (body ``{channels, namespaces?, depth?, since?}``) streams
the thread's runs one after the other as :class:`SessionStream`, each from the run's Redis
Stream as ``runs.join_stream`` reads it (:class:`~api.protocol.stream.relay.ProtocolStream`),
translated by :class:`~api.protocol.stream.session_events.SessionRun`: after ``since``, or
without it from the first run not yet ended, then each run accepted later, until the client
leaves. Between runs it waits on the thread's ``thread_runs_channel`` as ``threads.join_stream``
does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import structlog
from litestar.response import ServerSentEventMessage

from api.chat.relay import PING
from api.protocol.runs.input import RunCreate
from api.protocol.runs.service import OWN_KINDS, RUNS_LIST_MAX, ProtocolRuns
from api.protocol.stream.relay import ProtocolStream
from api.protocol.stream.session_events import (
    MAX_RUNS,
    MODES,
    SessionRun,
    Subscription,
    ordinal_of,
    run_seq,
)
from api.protocol.stream.translate import Part
from api.protocol.threads.state import pending_of
from api.resources import Resources
from api.runs.schemas import RunInfo
from shared.errors import BadRequest
from shared.redis.keys import thread_runs_channel

log = structlog.get_logger(__name__)

#: the close reason of a websocket event stream (its transport is not served: SSE is)
WEBSOCKET_REFUSED = "threads.stream over a websocket is not served by Sophos: use transport='sse'"
#: commands of the protocol Sophos does not serve, with why
UNSERVED_COMMANDS = {
    "subscription.subscribe": "subscriptions are the bodies of the event streams "
                              "(POST /threads/{id}/stream/events); the websocket transport is not served",
    "subscription.unsubscribe": "close the event stream instead",
    "subscription.reconnect": "open the event stream again with since",
    "agent.getTree": "the agent has no subgraphs: its graph is GET /assistants/{id}/graph",
    "input.inject": "send a new message with run.start",
    "state.get": "read the thread's state with threads.get_state",
    "state.listCheckpoints": "read the thread's checkpoints with threads.get_history",
    "state.fork": "fork with runs.create and a checkpoint_id",
}


def success(command_id: Any, result: dict[str, Any], seq: int | None = None) -> dict[str, Any]:
    answer = {"type": "success", "id": command_id, "result": result}
    return {**answer, "meta": {"applied_through_seq": seq}} if seq is not None else answer


def failure(command_id: Any, code: str, message: str) -> dict[str, Any]:
    return {"type": "error", "id": command_id, "error": code, "message": message}


async def runs_in_order(protocol_runs: ProtocolRuns, thread_id: str) -> list[RunInfo]:
    """The thread's runs, oldest first (Sophos's own left out, as ``runs.list`` does)."""
    page = await protocol_runs.runs.page(
        status=None, conversation_id=thread_id, limit=RUNS_LIST_MAX, cursor=None
    )
    if len(page.runs) >= min(RUNS_LIST_MAX, MAX_RUNS):
        raise BadRequest(
            f"threads.stream serves threads of fewer than {RUNS_LIST_MAX} runs; thread {thread_id} "
            "has more (follow it with threads.join_stream)"
        )
    return [r for r in reversed(page.runs) if r.kind not in OWN_KINDS]


async def command(protocol_runs: ProtocolRuns, thread_id: str, body: Any) -> dict[str, Any]:
    """One command's answer (errors of creating a run raise, as ``runs.create``'s do)."""
    if not isinstance(body, dict) or not isinstance(body.get("method"), str):
        return failure(None, "invalid_argument", 'a command is {"id", "method", "params"}')
    command_id, method, params = body.get("id"), body["method"], body.get("params") or {}
    if not isinstance(params, dict):
        return failure(command_id, "invalid_argument", "params must be an object")
    if method in UNSERVED_COMMANDS:
        return failure(
            command_id, "not_supported",
            f"{method} is not served by Sophos: {UNSERVED_COMMANDS[method]} (docs/agent-protocol.md)",
        )
    if method == "run.start":
        create = RunCreate(
            assistant_id=str(params.get("assistant_id") or ""), input=params.get("input"),
            config=params.get("config"), metadata=params.get("metadata"),
            langsmith_tracer=params.get("langsmith_tracer"), if_not_exists="create",
        )
    elif method == "input.respond":
        if "responses" in params:
            return failure(command_id, "not_supported", "input.respond with responses (several at once) "
                           "is not served by Sophos: answer each interrupt (docs/agent-protocol.md)")
        interrupt_id = params.get("interrupt_id")
        if not isinstance(interrupt_id, str) or params.get("namespace") not in (None, []):
            return failure(command_id, "invalid_argument",
                           "input.respond takes an interrupt_id of the root namespace []")
        found = await protocol_runs.threads.find(thread_id)
        pending = await protocol_runs.threads.store.read_thread(found.id, pending_of) or []
        if interrupt_id not in [i for i, _ in pending]:
            return failure(command_id, "no_such_interrupt",
                           f"thread {thread_id} has no pending interrupt {interrupt_id[:48]!r}")
        assistant_id = (await protocol_runs.options(await _newest(protocol_runs, thread_id))).assistant_id
        resume = {interrupt_id: params.get("response")}
        create = RunCreate(assistant_id=assistant_id, command={"resume": resume})
    else:
        return failure(command_id, "unknown_command", f"unknown command {method[:48]!r}")
    run, _ = await protocol_runs.create(thread_id, create)
    runs = await runs_in_order(protocol_runs, thread_id)
    ordinal = next(i for i, r in enumerate(runs) if r.id == run["run_id"])
    log.info("protocol.session_command", conversation_id=thread_id, run_id=run["run_id"], method=method)
    return success(command_id, {"run_id": run["run_id"]}, run_seq(ordinal) - 1)


async def _newest(protocol_runs: ProtocolRuns, thread_id: str) -> str:
    runs = await runs_in_order(protocol_runs, thread_id)
    if not runs:
        raise BadRequest(f"thread {thread_id} has no run waiting for input")
    return runs[-1].id


def encode(event: dict[str, Any]) -> bytes:
    return ServerSentEventMessage(
        id=event["event_id"], event=event["method"], data=msgspec.json.encode(event).decode()
    ).encode()


@dataclass(slots=True)
class SessionStream:
    resources: Resources
    thread_id: str
    subscription: Subscription
    #: the thread's runs, oldest first (:func:`runs_in_order`)
    runs: Callable[[], Awaitable[list[RunInfo]]]
    #: a run's assistant (``ProtocolRuns.options``)
    assistant_of: Callable[[str], Awaitable[str]]

    async def first(self) -> int:
        """Where the stream begins: the run ``since`` is in, else the first run not yet ended."""
        if self.subscription.since is not None:
            return ordinal_of(self.subscription.since + 1)
        runs = await self.runs()
        return next((i for i, r in enumerate(runs) if not r.status.finished), len(runs))

    async def _run(self, run_id: str, ordinal: int) -> AsyncIterator[bytes]:
        stream = ProtocolStream(
            self.resources, self.thread_id, run_id, await self.assistant_of(run_id), MODES
        )
        await stream.open()
        session = SessionRun(run_id, self.thread_id, ordinal)
        started = session.started()
        if self.subscription.wants(started):
            yield encode(started)
        # The parts of one entry, translated together (their events' seq).
        entry, parts = -1, list[Part]()
        async for part in stream.parts():
            if part is None:
                yield PING
                continue
            at = int(str(part.id).partition("-")[0])
            if at != entry:
                for event in self._flush(session, entry, parts):
                    yield event
                entry, parts = at, []
            parts.append(Part(part.event, part.data))
        for event in self._flush(session, entry, parts):
            yield event

    def _flush(self, session: SessionRun, entry: int, parts: list[Part]) -> list[bytes]:
        if not parts:
            return []
        return [encode(e) for e in session.events(entry, parts) if self.subscription.wants(e)]

    async def sse(self, ordinal: int) -> AsyncIterator[bytes]:
        redis, settings = self.resources.redis, self.resources.settings
        pubsub = redis.pubsub()
        await pubsub.subscribe(thread_runs_channel(self.thread_id))
        try:
            # Subscribed first: a run accepted from now on is announced, and found by the next look.
            runs = await self.runs()
            while not self.resources.draining.is_set():
                if ordinal < len(runs):
                    log.info("protocol.session_run", conversation_id=self.thread_id, run_id=runs[ordinal].id)
                    async for chunk in self._run(runs[ordinal].id, ordinal):
                        yield chunk
                    ordinal += 1
                    runs = await self.runs()
                    continue
                woken = await pubsub.get_message(
                    ignore_subscribe_messages=True, timeout=settings.sse_ping_interval
                )
                if woken is None:  # an announcement is not kept: look at the thread too
                    yield PING
                runs = await self.runs()
        finally:
            await pubsub.unsubscribe()
            await pubsub.aclose()
