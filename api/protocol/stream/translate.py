"""A run's native events (docs/events.md) as the Agent Server's stream, one entry at a time.

Pure: no I/O. The worker publishes ``token``, ``trace``, ``approval`` and a terminal ``end`` or
``chat-error`` to the run's Redis Stream; the protocol's stream routes relay that stream (the
same relay as ``GET /api/chat``) and pass each entry through :class:`Translator`:

* ``messages-tuple`` (the SSE event ``messages``): each token as an ``AIMessageChunk`` of the
  model turn it belongs to, each tool result as a ``tool`` message, with their metadata;
* ``updates``: ``{"agent": {"messages": [the turn's answer]}}`` when a model turn ends,
  ``{"tools": {"messages": [result]}}`` per tool result;
* ``updates`` also: ``{"__interrupt__": [...]}`` when the run pauses for a decision
  (:class:`Asked`);
* ``values``: the thread's state after each step of the run (:class:`ValuesAt`, sent when the
  next step begins) and once more when the run has ended (:data:`VALUES`: the run's own last
  checkpoint, so a replay ends as the run left the thread): the caller reads them, as only it can;
* then ``error`` (a run that failed or was interrupted) and ``end``.

Ids: the parts made of stream entry ``n`` are ``n-0``, ``n-1``...: unique, increasing, the same
from every API process, so ``Last-Event-ID`` resumes exactly after the last part seen. The
translation is a function of the entries from the first, so a resumed stream is translated
from the start and only the parts after that id are sent (:func:`after_id`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from api.protocol.status import run_status
from api.protocol.stream.messages import ai_chunk as ai_chunk
from api.protocol.stream.messages import ai_message, tool_message
from api.protocol.stream.modes import STEP_MODES, CheckpointAt, Out, StepModes
from shared.contracts.events import EventType, text_of
from shared.contracts.protocol import DEFAULT_STREAM_MODES as DEFAULT_STREAM_MODES
from shared.contracts.protocol import GRAPH_ID as GRAPH_ID
from shared.contracts.runs import AGENT, TOOLS, RunStatus
from shared.errors import BadRequest

#: the modes served; ``custom`` is taken and yields nothing (the agent writes no custom events);
#: the step modes are api/protocol/stream/modes.py's
STREAM_MODES: Final = ("values", "updates", "messages-tuple", "custom", *STEP_MODES)


class _Values:
    """Placeholder for the thread's state at the run's end (the run's last checkpoint), which the
    caller reads and sends as ``values``."""


VALUES: Final = _Values()


@dataclass(frozen=True, slots=True)
class ValuesAt:
    """Placeholder for the thread's state once ``steps`` steps of the run were done (0: its input
    taken), which the caller reads from the run's checkpoints and sends as ``values``."""

    steps: int


@dataclass(frozen=True, slots=True)
class Asked:
    """An ``approval`` event's requests, which ``updates`` sends as ``{"__interrupt__": [...]}``:
    the caller adds the interrupts' ids, which only the thread's state has."""

    requests: tuple[dict[str, Any], ...]


@dataclass(frozen=True, slots=True)
class Part:
    """One SSE event of the protocol's stream."""

    event: str
    data: Any
    id: str | None = None


#: what an entry becomes: events, and placeholders the caller fills in
Piece = Part | _Values | Asked | ValuesAt | CheckpointAt


def stream_modes(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """The stream modes asked for (a mode or a list), checked; the default when none."""
    if value is None or value == "" or value == []:
        return DEFAULT_STREAM_MODES
    modes = [value] if isinstance(value, str) else list(value)
    unknown = [m for m in modes if m not in STREAM_MODES]
    if unknown:
        raise BadRequest(
            f"stream_mode {unknown[0]!r} is not served; served: {', '.join(STREAM_MODES)}"
        )
    return tuple(dict.fromkeys(modes))


_EVENT_ID = re.compile(r"(-1|[0-9]{1,18}(?:-[0-9]{1,6})?)")


def after_id(last_event_id: str | None) -> tuple[int, int]:
    """The (entry, part) a ``Last-Event-ID`` names: parts up to it are not sent again.

    None, empty or ``-1``: nothing seen (the whole run is sent). ``n``: entry ``n`` was seen
    whole. ``n-k``: parts ``0..k`` of entry ``n``.
    """
    if last_event_id is None or last_event_id.strip() in ("", "-1"):
        return (0, -1)
    text = last_event_id.strip()
    if not _EVENT_ID.fullmatch(text):
        raise BadRequest(f"Last-Event-ID must be -1, n or n-k (from this stream), got {text[:32]!r}")
    entry, _, part = text.partition("-")
    return (int(entry), int(part) if part else 1_000_000)


@dataclass(slots=True)
class Translator:
    """Translates one run's entries, in order, from its first."""

    run_id: str
    thread_id: str
    assistant_id: str
    modes: tuple[str, ...]
    #: model turns begun so far (each ``enter`` of the agent node)
    turn: int = 0
    #: the id the current turn's answer is stored under, once the worker named it (a ``trace``
    #: ``message`` before its first token, or the agent's ``leave``)
    stored_id: str | None = None
    step: int = 0
    text: list[str] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    #: the step modes' parts (api/protocol/stream/modes.py)
    steps: StepModes = field(init=False)

    def __post_init__(self) -> None:
        self.steps = StepModes(self.run_id, self.modes)

    @property
    def message_id(self) -> str:
        """The answer's id: the one it is stored under (``run-<run>-<turn>`` for the events of a
        worker that did not name it)."""
        return self.stored_id or f"run-{self.run_id}-{self.turn}"

    def _meta(self, node: str) -> dict[str, Any]:
        return {
            "run_id": self.run_id, "thread_id": self.thread_id, "graph_id": GRAPH_ID,
            "assistant_id": self.assistant_id, "langgraph_node": node, "langgraph_step": self.step,
        }

    def entry(self, event: str, data: Any) -> list[Piece]:
        """What the native event ``event`` (with its decoded ``data``) becomes, ids not yet set."""
        if event == EventType.TOKEN:
            text = data if isinstance(data, str) else text_of(data)
            self.text.append(text)
            parts: list[Piece] = []
            if "messages-tuple" in self.modes:
                parts.append(Part("messages", [ai_chunk(text, self.message_id), self._meta(AGENT)]))
            steps = self.steps.token(self.message_id, "".join(self.text), text, self._meta(AGENT))
            return parts + _pieces(steps)
        if event == EventType.TRACE and isinstance(data, dict):
            return self._trace(data)
        if event in (EventType.END, EventType.CHAT_ERROR) and isinstance(data, dict):
            return self._ending(event, data)
        if event == EventType.APPROVAL and isinstance(data, dict) and "updates" in self.modes:
            return [Asked(tuple(r for r in data.get("requests") or [] if isinstance(r, dict)))]
        # ``missed``: nothing (the protocol has no such event).
        return []

    def _trace(self, trace: dict[str, Any]) -> list[Piece]:
        """A trace's parts, after a ``values`` of the state the steps before it left when it is
        the first of a step (the Agent Server sends ``values`` after every step)."""
        step = int(trace.get("step") or self.step)
        before: list[Piece] = []
        if step > self.step:
            if "values" in self.modes:
                before.append(ValuesAt(step - 1))
            before += _pieces(self.steps.step_done(step - 1))
        self.step = step
        return [*before, *self._traced(trace)]

    def _traced(self, trace: dict[str, Any]) -> list[Piece]:
        node, kind = trace.get("node"), trace.get("event")
        found = trace.get("data")
        body: dict[str, Any] = found if isinstance(found, dict) else {}
        parts: list[Piece] = []
        message: dict[str, Any] | None = None
        if node == AGENT and kind == "enter":
            self.turn += 1
            self.text, self.calls, self.stored_id = [], [], None
        elif node == AGENT and kind == "message" and isinstance(body.get("id"), str):
            self.stored_id = body["id"]
        elif node == AGENT and kind == "call":
            self.calls.append({
                "name": body.get("name"), "args": body.get("arguments") or {},
                "id": body.get("tool_call_id"), "type": "tool_call",
            })
        elif node == AGENT and kind == "leave" and not body.get("error"):
            if isinstance(body.get("message_id"), str):
                self.stored_id = body["message_id"]
            message = ai_message("".join(self.text), self.message_id, self.calls)
            if "updates" in self.modes:
                parts.append(Part("updates", {AGENT: {"messages": [message]}}))
        elif node == TOOLS and kind == "result":
            message = tool_message(body, self.run_id)
            if "updates" in self.modes:
                parts.append(Part("updates", {TOOLS: {"messages": [message]}}))
            if "messages-tuple" in self.modes:
                parts.append(Part("messages", [message, self._meta(TOOLS)]))
        if isinstance(node, str) and isinstance(kind, str):
            parts += _pieces(self.steps.trace(kind, node, body, self._meta(node), message))
        return parts

    def _ending(self, event: str, data: dict[str, Any]) -> list[Piece]:
        try:
            status = run_status(RunStatus(str(data.get("status"))), data.get("code") or None)
        except ValueError:
            status = "error"
        parts: list[Piece] = [VALUES] if "values" in self.modes else []
        parts += _pieces(self.steps.ending())
        if event == EventType.CHAT_ERROR:
            code, message = data.get("code"), data.get("message")
            error = {"error": code or "AGENT_FAILURE", "message": message or "the run failed"}
            parts.append(Part("error", error))
        parts.append(Part("end", {"run_id": self.run_id, "status": status}))
        return parts


def _pieces(out: list[Out]) -> list[Piece]:
    return [o if isinstance(o, CheckpointAt) else Part(o[0], o[1]) for o in out]


def number(
    parts: list[Piece], entry: int
) -> list[tuple[str, Piece]]:
    """The parts of stream entry ``entry`` with their ids."""
    return [(f"{entry}-{k}", part) for k, part in enumerate(parts)]


def is_terminal(event: str) -> bool:
    return event in (EventType.END, EventType.CHAT_ERROR)
