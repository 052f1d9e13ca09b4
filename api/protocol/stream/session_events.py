"""A run's events as the SDK's thread streaming session (``threads.stream``) reads them.

Pure: no I/O. :class:`~api.protocol.stream.relay.ProtocolStream` translates a run's native
events into the Agent Server's stream parts (``values``, ``updates``, ``messages``, ``end``...,
api/protocol/stream/translate.py); :class:`SessionRun` turns those parts into the session's
events, ``{"type": "event", "event_id", "seq", "method", "params": {"namespace": [], "data"}}``:

* ``lifecycle``: ``started`` when the stream comes to the run, then ``completed``, ``failed``
  (with its ``error``) or ``interrupted`` (the run paused for a decision);
* ``input.requested`` (channel ``input``): each pending interrupt, ``{interrupt_id, value,
  payload}``, which ``input.respond`` answers;
* ``values``: the thread's values after each step and at the end;
* ``updates``: ``{node, values}`` for each node's update;
* ``messages``: each answer of the model as ``message-start``, a text block (``content-block-start``,
  a ``content-block-delta`` per token, ``content-block-finish``), a ``tool_call`` block per call
  it asks for, then ``message-finish``.

``seq`` numbers the thread's events: ``(run's place among the thread's runs, from 1) << 32 | (the run's
stream entry) << 10 | (the event's place among that entry's events)``. It is the same from every
connection and every API process (the translation is a function of the run's entries, taken
whole, whatever the subscription), so ``since`` resumes exactly and ``event_id`` (the seq as
text) dedups a replay. A run's ``lifecycle`` ``started`` is entry 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from api.protocol.stream.translate import GRAPH_ID, Part
from shared.contracts.runs import AGENT
from shared.errors import BadRequest

#: the translation's modes, always all of them: an event's seq must not depend on the subscription
MODES: Final = ("values", "updates", "messages-tuple")
#: channels served; ``custom`` is taken and carries nothing (the agent writes no custom events)
CHANNELS: Final = ("values", "updates", "messages", "lifecycle", "input", "custom")
#: channels refused by name, with why
UNSERVED_CHANNELS: Final = {
    "tools": "tool calls show as the model's tool_call blocks (messages) and their results as "
             "updates of the tools node",
    "checkpoints": "read a thread's checkpoints with threads.get_history",
    "tasks": "the agent's steps show as updates",
}
#: ``lifecycle`` data of the run's end, by the SDK's run status (``end``)
_ENDED: Final = {"success": "completed"}
RUN_BITS: Final = 32
ENTRY_BITS: Final = 10
#: at most this many runs of a thread are numbered (a seq stays below 2**53, JSON's safe integers)
MAX_RUNS: Final = (1 << (53 - RUN_BITS)) - 1


def run_seq(ordinal: int) -> int:
    """The seq of a run's first event (its ``lifecycle`` ``started``); the first run's is 2**32,
    so the seq before it is one too (``applied_through_seq`` of its ``run.start``)."""
    return (ordinal + 1) << RUN_BITS


def ordinal_of(seq: int) -> int:
    """The place of the run an event's seq is in (0 for a seq before the first run's)."""
    return max(0, (seq >> RUN_BITS) - 1)


def seq_of(ordinal: int, entry: int, index: int) -> int:
    if index >= 1 << ENTRY_BITS or entry >= 1 << (RUN_BITS - ENTRY_BITS):
        raise ValueError(f"event {entry}-{index} of run {ordinal} is out of the seq's range")
    return run_seq(ordinal) | entry << ENTRY_BITS | index


@dataclass(frozen=True, slots=True)
class Subscription:
    """What an event stream asks for (the body of ``POST /threads/{id}/stream/events``)."""

    channels: frozenset[str]
    since: int | None = None

    @classmethod
    def parse(cls, body: Any) -> Subscription:
        if not isinstance(body, dict) or not isinstance(body.get("channels"), list):
            raise BadRequest('the event stream takes {"channels": [...], "namespaces"?, "depth"?, "since"?}')
        channels = [c for c in body["channels"] if isinstance(c, str)]
        if len(channels) != len(body["channels"]):
            raise BadRequest("channels must be names")
        for name in channels:
            if name in UNSERVED_CHANNELS:
                raise BadRequest(
                    f"channel {name!r} of threads.stream is not served by Sophos: "
                    f"{UNSERVED_CHANNELS[name]} (docs/agent-protocol.md)"
                )
            if name not in CHANNELS and not name.startswith("custom:"):
                raise BadRequest(f"channel {name[:32]!r} is unknown; served: {', '.join(CHANNELS)}")
        since = body.get("since")
        if since is not None and (not isinstance(since, int) or isinstance(since, bool) or since < 0):
            raise BadRequest("since must be a seq of this thread's events (a whole number)")
        depth = body.get("depth")
        if depth is not None and (not isinstance(depth, int) or depth < 0):
            raise BadRequest("depth must be a whole number")
        namespaces = body.get("namespaces")
        if namespaces is not None and not (
            isinstance(namespaces, list) and all(isinstance(n, list) for n in namespaces)
        ):
            raise BadRequest("namespaces must be a list of namespaces (lists of names)")
        # Every event of the agent is at the root namespace (it has no subgraphs): a subscription
        # scoped to namespaces gets them only if the root is one of its prefixes.
        root = namespaces is None or [] in namespaces
        return cls(frozenset(channels) if root else frozenset(), since)

    def wants(self, event: dict[str, Any]) -> bool:
        method = event["method"]
        channel = "input" if method == "input.requested" else method
        return channel in self.channels and (self.since is None or event["seq"] > self.since)


def _event(seq: int, method: str, data: Any) -> dict[str, Any]:
    return {
        "type": "event", "event_id": str(seq), "seq": seq, "method": method,
        "params": {"namespace": [], "data": data},
    }


@dataclass(slots=True)
class SessionRun:
    """Translates one run's parts, in order, from its first, into the session's events."""

    run_id: str
    thread_id: str
    ordinal: int
    #: the answer being streamed: its id and text so far (None: none open)
    open_id: str | None = None
    text: list[str] = field(default_factory=list)
    #: interrupts the run paused on (its end is then ``interrupted``)
    asked: bool = False
    error: str | None = None

    def started(self) -> dict[str, Any]:
        return _event(run_seq(self.ordinal), "lifecycle", {"event": "started", "graph_name": GRAPH_ID})

    def events(self, entry: int, parts: list[Part]) -> list[dict[str, Any]]:
        """The events of one stream entry's parts (all of them, in order)."""
        out: list[tuple[str, Any]] = []
        for part in parts:
            out += self._part(part)
        return [_event(seq_of(self.ordinal, entry, i), m, d) for i, (m, d) in enumerate(out)]

    def _part(self, part: Part) -> list[tuple[str, Any]]:
        data = part.data
        if part.event == "values":
            return [("values", data)]
        if part.event == "messages":
            message, meta = data
            if message.get("type") != "AIMessageChunk":
                return []  # a tool's result: an update of the tools node
            return self._token(str(message["id"]), str(message.get("content") or ""), meta)
        if part.event == "updates":
            return self._update(data)
        if part.event == "error":
            self.error = str(data.get("message") or data.get("error") or "the run failed")
            return []
        if part.event == "end":
            return [("lifecycle", self._ending(str(data.get("status"))))]
        return []

    def _token(self, message_id: str, text: str, meta: dict[str, Any]) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        if self.open_id != message_id:
            out += self._start(message_id, meta)
        self.text.append(text)
        out.append(("messages", {"event": "content-block-delta", "index": 0,
                                 "delta": {"type": "text-delta", "text": text}}))
        return out

    def _start(self, message_id: str, meta: dict[str, Any]) -> list[tuple[str, Any]]:
        self.open_id, self.text = message_id, []
        metadata = {k: v for k, v in meta.items() if v is None or isinstance(v, (bool, int, float, str))}
        return [
            ("messages", {"event": "message-start", "role": "ai", "id": message_id, "metadata": metadata}),
            ("messages", {"event": "content-block-start", "index": 0,
                          "content": {"type": "text", "text": ""}}),
        ]

    def _update(self, data: dict[str, Any]) -> list[tuple[str, Any]]:
        if "__interrupt__" in data:
            self.asked = True
            # An interrupt decided since (a replay) has no id any more: nothing to answer.
            return [
                ("input.requested", {"interrupt_id": i["id"], "value": i["value"], "payload": i["value"]})
                for i in data["__interrupt__"] if i.get("id")
            ]
        out: list[tuple[str, Any]] = []
        for node, values in data.items():
            out.append(("updates", {"node": node, "values": values}))
            if node == AGENT:
                for message in values.get("messages") or []:
                    out += self._finish(message)
        return out

    def _finish(self, message: dict[str, Any]) -> list[tuple[str, Any]]:
        """The answer's end: its text block whole, a block per tool call, ``message-finish``."""
        message_id = str(message.get("id"))
        out: list[tuple[str, Any]] = []
        if self.open_id != message_id:  # no token came (an answer of tool calls only)
            meta = {"run_id": self.run_id, "thread_id": self.thread_id, "langgraph_node": AGENT}
            out += self._start(message_id, meta)
        content = message.get("content")
        text = content if isinstance(content, str) else "".join(self.text)
        out.append(("messages", {"event": "content-block-finish", "index": 0,
                                 "content": {"type": "text", "text": text}}))
        for n, call in enumerate(message.get("tool_calls") or [], start=1):
            block = {"type": "tool_call", "id": call.get("id"), "name": call.get("name"),
                     "args": call.get("args") or {}}
            out.append(("messages", {"event": "content-block-start", "index": n, "content": block}))
            out.append(("messages", {"event": "content-block-finish", "index": n, "content": block}))
        out.append(("messages", {"event": "message-finish"}))
        self.open_id, self.text = None, []
        return out

    def _ending(self, status: str) -> dict[str, Any]:
        if self.error is not None or status not in _ENDED:
            error = self.error or f"the run ended: {status}"
            return {"event": "failed", "graph_name": GRAPH_ID, "error": error}
        if self.asked:
            return {"event": "interrupted", "graph_name": GRAPH_ID}
        return {"event": _ENDED[status], "graph_name": GRAPH_ID}
