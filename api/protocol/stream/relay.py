"""A run's event stream in the Agent Server's shape: the native relay, translated.

The relay (api/chat/relay.py) does the hard part exactly as for ``GET /api/chat``: one reader of the
run's Redis Stream per API process, replay from any id, pings, the rebuilt ending of a run
whose stream expired, the end of streams when the server drains. Its output is the native SSE
(docs/events.md); :class:`ProtocolStream` reads it back event by event and passes each through
the :class:`~api.protocol.stream.translate.Translator`.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec
import structlog
from litestar.response import ServerSentEventMessage

from api.chat.relay import PING, Ending, Relay
from api.protocol.runs.interrupts import hitl_value, interrupts_of
from api.protocol.stream.modes import CheckpointAt, checkpoint_event
from api.protocol.stream.translate import VALUES, Asked, Part, Translator, ValuesAt, is_terminal, number
from api.protocol.threads.state import pending_of, thread_history, thread_state, values_with_interrupts
from api.resources import Resources
from api.runs.cancel import cancel_run
from shared.errors import NotFound, SophosError

log = structlog.get_logger(__name__)

#: at most this many checkpoints of one run are read for its ``values`` after each step
RUN_CHECKPOINTS_MAX = 1000


@dataclass(frozen=True, slots=True)
class Native:
    """One native SSE event: its id (an entry of the run's stream; None for none) and data."""

    id: int | None
    event: str
    data: Any


def native_events(chunk: bytes) -> Iterator[Native | None]:
    """The events of a chunk of the relay's output (whole events, lines ending CRLF as Litestar
    writes them); None for a ping (a comment)."""
    for block in chunk.replace(b"\r\n", b"\n").split(b"\n\n"):
        if not block.strip(b"\r\n"):
            continue
        if block.startswith(b":"):
            yield None
            continue
        event_id: int | None = None
        event, data = "message", b""
        for line in block.split(b"\n"):
            name, _, value = line.partition(b":")
            value = value[1:] if value.startswith(b" ") else value
            if name == b"id":
                event_id = int(value) if value.isdigit() else None
            elif name == b"event":
                event = value.decode()
            elif name == b"data":
                data = value if not data else data + b"\n" + value
        try:
            decoded = msgspec.json.decode(data) if data else None
        except msgspec.DecodeError:
            decoded = None
        yield Native(event_id, event, decoded)


def encode(part: Part) -> bytes:
    return ServerSentEventMessage(
        id=part.id, event=part.event, data=msgspec.json.encode(part.data).decode()
    ).encode()


async def _once(chunk: bytes) -> AsyncIterator[bytes]:
    yield chunk


@dataclass(slots=True)
class ProtocolStream:
    """One run's events, translated, after the (entry, part) ``after``."""

    resources: Resources
    thread_id: str
    run_id: str
    assistant_id: str
    modes: tuple[str, ...]
    after: tuple[int, int] = (0, -1)
    relay: Relay | None = None
    ending: bytes | Ending | None = None
    #: the run's checkpoints read so far, oldest first (:meth:`values_after`)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)

    async def open(self) -> None:
        """Look at the run's stream before the answer starts (errors then get an envelope).

        Always from its first entry: the translation carries state from entry to entry
        (which model turn a token belongs to), so a resumed stream is translated again from
        the start and only what follows ``after`` is sent.
        """
        r = self.resources
        self.relay = Relay(
            redis=r.redis, store=r.store, feeds=r.feeds, conversation_id=self.thread_id, run_id=self.run_id,
            after=0, ping_ms=max(1, round(r.settings.sse_ping_interval * 1000)), draining=r.draining,
        )
        self.ending = await self.relay.ending()

    def _source(self) -> AsyncIterator[bytes]:
        if self.relay is None:
            raise RuntimeError("open() the stream first")
        if isinstance(self.ending, bytes):
            return _once(self.ending)
        return self.relay.events()

    async def state(self) -> dict[str, Any] | None:
        """The run's state at its end: the run's own last checkpoint (so a stream replayed after
        the thread moved on ends as the run left it, not as the thread is now); the thread's state
        now when the run has no checkpoint of its own (it failed before its input was taken);
        None when unreadable."""
        newest = await self._read(1)
        if newest:
            return newest[-1]
        return await self._thread_state()

    async def _thread_state(self) -> dict[str, Any] | None:
        try:
            state: dict[str, Any] | None = await self.resources.store.read_thread(
                self.thread_id, thread_state
            )
        except SophosError as exc:
            log.warning("protocol.values_unread", error=exc.message)
            return None
        return state

    async def values(self) -> dict[str, Any]:
        state = await self.state()
        return values_with_interrupts(state) if state is not None else {}

    async def values_after(self, steps: int) -> dict[str, Any] | None:
        """The thread's values once ``steps`` steps of the run were done (0: its input taken);
        None when the run has no such checkpoint."""
        found = await self.checkpoint_after(steps)
        return found["values"] if found is not None else None

    async def checkpoint_at(self, at: CheckpointAt) -> dict[str, Any] | None:
        """A :class:`CheckpointAt`'s event data (the run's end: :meth:`state`); None when its
        checkpoint cannot be read."""
        state = await (self.state() if at.steps is None else self.checkpoint_after(at.steps))
        return checkpoint_event(at.event, state) if state is not None else None

    async def checkpoint_after(self, steps: int) -> dict[str, Any] | None:
        """The run's checkpoint once ``steps`` steps of it were done (0: its input taken), from
        the run's own checkpoints (their metadata names the run); None when it has none.

        Read once whole, then (a live run's next step) only the newest few, which follow the
        ones read: a run of n steps costs about n small reads, not n whole ones."""
        found = self._after(steps)
        if found is None and self.checkpoints:
            newer = await self._read(max(2, steps + 2 - len(self.checkpoints)))
            last = (self.checkpoints[-1]["checkpoint"] or {}).get("checkpoint_id")
            follows = [
                i for i, c in enumerate(newer or [])
                if (c.get("parent_checkpoint") or {}).get("checkpoint_id") == last
            ]
            if newer is not None and follows:
                self.checkpoints += newer[follows[0]:]
                found = self._after(steps)
        if found is None:  # the run's checkpoints as they are now, whole
            whole = await self._read(RUN_CHECKPOINTS_MAX)
            if whole is not None:
                self.checkpoints = whole
                found = self._after(steps)
        return found

    async def _read(self, limit: int) -> list[dict[str, Any]] | None:
        """The run's ``limit`` newest checkpoints, oldest first; None when unreadable."""
        read = functools.partial(thread_history, limit, None, {"run_id": self.run_id})
        try:
            states = await self.resources.store.read_thread(self.thread_id, read) or []
        except SophosError as exc:
            log.warning("protocol.values_unread", error=exc.message)
            return None
        return list(reversed(states))

    def _after(self, steps: int) -> dict[str, Any] | None:
        """Of the run's checkpoints read so far, the one after ``steps`` steps. A run with a
        message has a checkpoint of its input first; a resume starts from the checkpoint it
        resumes, which is not its own."""
        has_input = bool(self.checkpoints) and self.checkpoints[0]["metadata"].get("source") == "input"
        loops = [c for c in self.checkpoints if c["metadata"].get("source") == "loop"]
        index = steps if has_input else steps - 1
        return loops[index] if 0 <= index < len(loops) else None

    async def interrupts(self, asked: Asked) -> list[dict[str, Any]]:
        """The interrupts of an ``approval`` event: with their ids while the thread still has them
        pending; else (decided since) as the event had them, without an id."""
        try:
            pending = await self.resources.store.read_thread(self.thread_id, pending_of) or []
        except SophosError as exc:
            log.warning("protocol.interrupts_unread", error=exc.message)
            pending = []
        calls = {str(r.get("id")) for r in asked.requests}
        if pending and {str(r["id"]) for _, rs in pending for r in rs} == calls:
            return interrupts_of(pending)
        return [{"value": hitl_value({"requests": list(asked.requests)})}]

    async def parts(self) -> AsyncIterator[Part | None]:
        """The translated parts after ``after`` (None: a ping), up to the run's ``end``."""
        translator = Translator(self.run_id, self.thread_id, self.assistant_id, self.modes)
        async for chunk in self._source():
            for native in native_events(chunk):
                if native is None:
                    yield None
                    continue
                if native.id is None:
                    continue  # `missed`: the protocol has no such event
                for part_id, part in number(translator.entry(native.event, native.data), native.id):
                    entry, _, k = part_id.partition("-")
                    if (int(entry), int(k)) <= self.after:
                        continue
                    if part is VALUES:
                        yield Part("values", await self.values(), part_id)
                    elif isinstance(part, ValuesAt):
                        values = await self.values_after(part.steps)
                        if values is not None:
                            yield Part("values", values, part_id)
                    elif isinstance(part, CheckpointAt):
                        data = await self.checkpoint_at(part)
                        if data is not None:
                            yield Part(part.event, data, part_id)
                    elif isinstance(part, Asked):
                        yield Part("updates", {"__interrupt__": await self.interrupts(part)}, part_id)
                    elif isinstance(part, Part):
                        yield Part(part.event, part.data, part_id)
                if is_terminal(native.event):
                    return

    async def sse(self, metadata: bool) -> AsyncIterator[bytes]:
        """The stream as SSE bytes, ``metadata`` (with the run id) first when asked."""
        if metadata:
            yield encode(Part("metadata", {"run_id": self.run_id, "thread_id": self.thread_id}))
        async for part in self.parts():
            yield PING if part is None else encode(part)

    async def outcome(self) -> tuple[str, dict[str, Any]]:
        """Wait for the run's end: its SDK status and, for a run that ended in error, the error."""
        status, error = "error", {}
        async for part in self.parts():
            if part is None:
                continue
            if part.event == "error":
                error = part.data
            elif part.event == "end":
                status = part.data["status"]
        if self.relay is not None and self.relay.unknown:
            # Nothing is known of the run any more (the relay gave it up after a bounded wait).
            raise NotFound(f"run {self.run_id} not found")
        return status, error


async def cancelled_when_left(
    content: AsyncIterator[bytes], resources: Resources, run_id: str
) -> AsyncIterator[bytes]:
    """``content``; if its client leaves before the run's end, the run is cancelled (as
    ``runs.cancel`` does). A stream the server ends (it drains) cancels nothing."""
    ended = False
    try:
        async for chunk in content:
            yield chunk
        ended = True
    finally:
        if not ended:
            with anyio.CancelScope(shield=True), contextlib.suppress(SophosError):
                await cancel_run(resources.runs, run_id)
                log.info("protocol.cancelled_on_disconnect", run_id=run_id)
