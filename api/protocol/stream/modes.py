"""The stream modes that retell a run's steps: ``messages``, ``tasks``, ``checkpoints``,
``debug`` and ``events``, in the Agent Server's shapes (langgraph_sdk/schema.py).

Pure: no I/O. :class:`~api.protocol.stream.translate.Translator` hands each native event here once it
has read it (which model turn, which step, the answer so far); what comes back is SSE events
as ``(event, data)`` and :class:`CheckpointAt` placeholders, which the stream fills with a
checkpoint of the run (api/protocol/stream/relay.py), as it fills ``values``:

* ``messages`` (the SDK's ``messages``, not ``messages-tuple``): ``messages/metadata``
  (``{id: {"metadata": …}}``) before a message's first part, ``messages/partial`` (the answer so
  far, an ``ai`` message) per token, ``messages/complete`` for the whole answer (with its tool
  calls) when its turn ends and for each tool result;
* ``tasks``: a task's start (``{id, name, input, triggers}``) when a node begins, its result
  (``{id, name, error, result, interrupts}``) when it ends. ``input`` is null: the state it
  read is the ``values`` before it;
* ``checkpoints``: each checkpoint of the run (``{config, parent_config, values, metadata,
  next, tasks}``), after each step and once more at the end, read as ``values`` are;
* ``debug``: the same checkpoints, task starts and results, each as ``{type, timestamp, step,
  payload}`` with ``type`` ``checkpoint``, ``task`` or ``task_result``;
* ``events``: LangChain's ``astream_events`` (v2) shapes: ``on_chain_start``/``on_chain_end`` of
  the graph and of each node, ``on_chat_model_start``/``_stream``/``_end`` of each model turn,
  ``on_tool_end`` per tool result.

Task ids are LangGraph's, which the worker's ``enter``/``leave`` traces carry; for events of a
worker that did not, they are made from the run, step and node.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from api.protocol.stream.messages import ai_chunk
from shared.contracts.runs import AGENT, TOOLS

#: the modes this module serves (``values``, ``updates``, ``messages-tuple`` are translate's)
STEP_MODES: Final = ("messages", "tasks", "checkpoints", "debug", "events")

#: the graph's name in ``events`` (LangGraph's default name of a compiled graph)
GRAPH_NAME: Final = "LangGraph"
#: what started each node's task, as LangGraph names its triggers
_TRIGGERS: Final = {AGENT: ["branch:to:agent"], TOOLS: ["__pregel_push"]}


@dataclass(frozen=True, slots=True)
class CheckpointAt:
    """Placeholder for the run's checkpoint once ``steps`` steps were done (None: the thread's
    state at the run's end), which the caller reads and sends as ``event`` (``checkpoints`` or
    ``debug``: :func:`checkpoint_event`)."""

    steps: int | None
    event: str


Out = tuple[str, Any] | CheckpointAt


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _config(checkpoint: dict[str, Any] | None) -> dict[str, Any] | None:
    if not checkpoint:
        return None
    return {"configurable": {
        "thread_id": checkpoint.get("thread_id"), "checkpoint_ns": checkpoint.get("checkpoint_ns", ""),
        "checkpoint_id": checkpoint.get("checkpoint_id"),
    }}


def checkpoint_payload(state: dict[str, Any]) -> dict[str, Any]:
    """A state (as ``get_state`` or a history gives it) as the ``checkpoints`` mode's payload."""
    tasks = []
    for task in state.get("tasks") or []:
        entry: dict[str, Any] = {"id": task["id"], "name": task["name"]}
        if task.get("error"):
            entry["error"] = task["error"]
        else:
            entry["interrupts"] = task.get("interrupts") or []
        entry["state"] = None
        tasks.append(entry)
    return {
        "config": _config(state.get("checkpoint")), "parent_config": _config(state.get("parent_checkpoint")),
        "values": state.get("values") or {}, "metadata": state.get("metadata") or {},
        "next": state.get("next") or [], "tasks": tasks,
    }


def checkpoint_event(event: str, state: dict[str, Any]) -> dict[str, Any]:
    """What a :class:`CheckpointAt` becomes, given the state it names."""
    payload = checkpoint_payload(state)
    if event == "checkpoints":
        return payload
    step = int((state.get("metadata") or {}).get("step") or 0)
    return {
        "type": "checkpoint", "timestamp": state.get("created_at") or _now(), "step": step,
        "payload": payload,
    }


@dataclass(slots=True)
class StepModes:
    """One run's parts of the step modes it asked for, fed its native events in order."""

    run_id: str
    modes: tuple[str, ...]
    now: Callable[[], str] = _now
    #: message ids whose ``messages/metadata`` was sent
    announced: set[str] = field(default_factory=set)
    #: per node, the ids of its tasks begun and not yet ended, oldest first
    open_tasks: dict[str, list[str]] = field(default_factory=dict)
    #: tasks begun so far (for the ids of tasks a worker did not name)
    begun: int = 0
    #: the last tool result, which its task's end carries
    tool_result: dict[str, Any] | None = None
    graph_started: bool = False
    model_started: bool = False

    def wants(self, mode: str) -> bool:
        return mode in self.modes

    def step_done(self, steps: int) -> list[Out]:
        """Before the first event of a new step: the checkpoint the steps before it left."""
        return [CheckpointAt(steps, m) for m in ("checkpoints", "debug") if self.wants(m)]

    def token(self, message_id: str, text_so_far: str, chunk: str, meta: dict[str, Any]) -> list[Out]:
        out: list[Out] = []
        if self.wants("messages"):
            out += self._announce(message_id, meta)
            partial = {**ai_chunk(text_so_far, message_id), "type": "ai"}
            del partial["tool_call_chunks"]
            out.append(("messages/partial", [partial]))
        if self.wants("events"):
            if not self.model_started:
                self.model_started = True
                out.append(self._event("on_chat_model_start", "model", meta, {"input": {}}))
            streamed = {"chunk": ai_chunk(chunk, message_id)}
            out.append(self._event("on_chat_model_stream", "model", meta, streamed))
        return out

    def trace(
        self, kind: str, node: str, body: dict[str, Any], meta: dict[str, Any], message: dict[str, Any] | None
    ) -> list[Out]:
        """A ``trace`` event; ``message`` is the answer when the agent's turn ends, the tool message
        for a result."""
        out: list[Out] = []
        if self.wants("events") and not self.graph_started:
            self.graph_started = True
            out.append(("events", {
                "event": "on_chain_start", "name": GRAPH_NAME, "run_id": self.run_id, "tags": [],
                "metadata": meta, "data": {"input": None}, "parent_ids": [],
            }))
        if kind == "enter":
            out += self._enter(node, body, meta)
        elif kind == "leave":
            out += self._leave(node, body, meta, message)
        elif kind == "result" and message is not None:
            self.tool_result = message
            if self.wants("messages"):
                out += [*self._announce(message["id"], meta), ("messages/complete", [message])]
            if self.wants("events"):
                name = str(message.get("name"))
                out.append(self._event("on_tool_end", name, meta, {"output": message}, message["id"]))
        return out

    def ending(self) -> list[Out]:
        out: list[Out] = [CheckpointAt(None, m) for m in ("checkpoints", "debug") if self.wants(m)]
        if self.wants("events") and self.graph_started:
            out.append(("events", {
                "event": "on_chain_end", "name": GRAPH_NAME, "run_id": self.run_id, "tags": [],
                "metadata": {}, "data": {}, "parent_ids": [],
            }))
        return out

    def _announce(self, message_id: str, meta: dict[str, Any]) -> list[Out]:
        if message_id in self.announced:
            return []
        self.announced.add(message_id)
        return [("messages/metadata", {message_id: {"metadata": meta}})]

    def _task_id(self, node: str, body: dict[str, Any]) -> str:
        if isinstance(body.get("task"), str):
            return str(body["task"])
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"sophos:{self.run_id}:{self.begun}:{node}"))

    def _enter(self, node: str, body: dict[str, Any], meta: dict[str, Any]) -> list[Out]:
        task_id = self._task_id(node, body)
        self.begun += 1
        self.open_tasks.setdefault(node, []).append(task_id)
        if node == AGENT:
            self.model_started = False
        start = {"id": task_id, "name": node, "input": None, "triggers": _TRIGGERS.get(node, [])}
        out: list[Out] = []
        if self.wants("tasks"):
            out.append(("tasks", start))
        if self.wants("debug"):
            out.append(self._debug("task", meta, start))
        if self.wants("events"):
            out.append(self._event("on_chain_start", node, meta, {"input": None}, task_id))
        return out

    def _leave(
        self, node: str, body: dict[str, Any], meta: dict[str, Any], message: dict[str, Any] | None
    ) -> list[Out]:
        opened = self.open_tasks.get(node) or []
        named = body.get("task")
        if isinstance(named, str) and named in opened:
            opened.remove(named)
            task_id = named
        else:
            task_id = opened.pop(0) if opened else self._task_id(node, body)
        if node == TOOLS:
            message, self.tool_result = self.tool_result, None
        error = body.get("error") or ("stopped" if body.get("stopped") else None)
        result = {"messages": [message]} if message is not None and not error else {}
        out: list[Out] = []
        if node == AGENT and message is not None and not error:
            if self.wants("messages"):
                out += [*self._announce(message["id"], meta), ("messages/complete", [message])]
            if self.wants("events"):
                if not self.model_started:
                    out.append(self._event("on_chat_model_start", "model", meta, {"input": {}}))
                out.append(self._event("on_chat_model_end", "model", meta, {"output": message}))
        done: dict[str, Any] = {
            "id": task_id, "name": node, "error": str(error) if error else None, "result": result,
            "interrupts": [],
        }
        if self.wants("tasks"):
            out.append(("tasks", done))
        if self.wants("debug"):
            out.append(self._debug("task_result", meta, done))
        if self.wants("events"):
            out.append(self._event("on_chain_end", node, meta, {"output": result}, task_id))
        return out

    def _debug(self, kind: str, meta: dict[str, Any], payload: dict[str, Any]) -> tuple[str, Any]:
        step = meta["langgraph_step"]
        return ("debug", {"type": kind, "timestamp": self.now(), "step": step, "payload": payload})

    def _event(
        self, event: str, name: str, meta: dict[str, Any], data: dict[str, Any], task_id: str | None = None
    ) -> tuple[str, Any]:
        """An ``astream_events`` v2 event; its ``run_id`` is its own, made from what it is part of."""
        step, node = meta.get("langgraph_step"), meta.get("langgraph_node")
        key = task_id or f"{step}:{node}:{event.rsplit('_', 1)[0]}"
        own = str(uuid.uuid5(uuid.NAMESPACE_URL, f"sophos:{self.run_id}:{key}:{name}"))
        return ("events", {
            "event": event, "name": name, "run_id": own, "tags": [], "metadata": meta, "data": data,
            "parent_ids": [self.run_id],
        })
