"""A run's graph stream, told as the run's events: where an event leaves the worker.

The run service streams the graph in three modes (worker/run/service.py) and hands each
item to :meth:`RunStream.tell`, which publishes at once (worker/run/publish/events.py):

* ``messages``: each piece of the model's answer, a ``token``; before its first, a ``trace``
  ``message`` naming the id the answer is stored under (the Agent Protocol's streamed chunks
  carry it, so a client merging them with the thread's state sees one message);
* ``tasks``: each node's start and end, a ``trace`` (``enter``/``leave``), with the tool
  calls the model asked for (``call``) and each tool's result (``result``);
* ``values``: the state after each step, published as nothing: the last one is the
  thread's final state (:class:`FinalState`), so the outcome needs no checkpoint read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage, AIMessageChunk, ToolMessage

from shared.contracts.events import text_of
from worker.agent.graph import AGENT, TOOLS
from worker.run.lifetime.stopping import Closed, LiveRun
from worker.run.publish.events import EventPublisher
from worker.run.publish.progress import RunTracker


@dataclass(slots=True)
class FinalState:
    message_count: int = 0
    #: set when the graph stopped at an approval: the calls waiting for a decision
    requests: list[dict[str, Any]] | None = None
    #: a switch's branch has tasks left to run (its conversation is resumable)
    pending: bool = False


@dataclass(slots=True, eq=False)
class RunStream:
    """Tells one run's stream items as its events, counting its steps."""

    events: EventPublisher
    live: LiveRun
    tracker: RunTracker
    step: int = 0
    final: FinalState = field(default_factory=FinalState)
    #: the id of the answer being streamed (its chunks', which the stored message keeps)
    message_id: str | None = None

    async def tell(self, item: tuple[str, Any]) -> None:
        mode, payload = item
        if mode == "values":
            # The whole state after each step (a reference, not a copy).
            self.final.message_count = len(payload.get("messages", []))
        elif mode == "messages":
            await self._token(*payload)
        elif mode == "tasks":
            await (self._enter(payload) if "input" in payload else self._leave(payload))

    async def _token(self, chunk: Any, meta: dict[str, Any]) -> None:
        if meta.get("langgraph_node") == AGENT and isinstance(chunk, AIMessageChunk):
            text = text_of(chunk.content)
            if text and chunk.id and chunk.id != self.message_id:
                # Before the answer's first token (an answer of tool calls only is named by its
                # ``leave``).
                self.message_id = chunk.id
                await self.events.trace(self.step, AGENT, "message", AGENT, {"id": chunk.id})
            if text:
                self.live.streamed(text)
                self.tracker.token()
                await self.events.token(text)

    async def _enter(self, payload: dict[str, Any]) -> None:
        node = payload["name"]
        # A tools step has a task per call (worker/agent/graph.py): one step, several enters.
        if self.live.started(node, payload.get("id") or ""):
            self.step += 1
            self.tracker.step_started(self.step, node, self.events)
        task = {"task": payload["id"]} if payload.get("id") else None  # the protocol's task ids
        await self.events.trace(self.step, node, "enter", node, task)

    async def _leave(self, payload: dict[str, Any]) -> None:
        node = payload["name"]
        result = None if payload.get("error") else payload.get("result")
        self.live.finished(node, payload.get("id") or "", result)
        if payload.get("interrupts"):
            # The approval step's one interrupt per turn, or one per call that may have run, each
            # raised by its own task of the same step (worker/tools/ledger/): the requests of
            # them all are the approval's. (The tasks stream gives each interrupt as a dict:
            # {"value", "id"}.)
            requests = list(self.final.requests or [])
            for interrupt in payload["interrupts"]:
                value = interrupt["value"] if isinstance(interrupt, dict) else interrupt.value
                requests += [r for r in value["requests"] if r not in requests]
            self.final.requests = requests
        messages = (payload.get("result") or {}).get("messages", [])
        for message in messages:
            await self._trace_message(node, message)
        leave: dict[str, Any] | None = {"error": payload["error"]} if payload.get("error") else None
        answer = next((m for m in messages if isinstance(m, AIMessage) and m.id), None)
        if node == AGENT and leave is None and answer is not None:
            leave = {"message_id": answer.id}  # the id the answer is stored under
        if payload.get("id"):
            leave = {**(leave or {}), "task": payload["id"]}
        await self.events.trace(self.step, node, "leave", node, leave)
        self.tracker.task_finished(self.events)

    async def _trace_message(self, node: str, message: Any) -> None:
        """The tool calls an answer asks for, and a tool's result: where a tool call is told."""
        if node == AGENT and isinstance(message, AIMessage):
            for call in message.tool_calls:
                await self.events.trace(self.step, node, "call", call["name"], {
                    "name": call["name"], "arguments": call["args"], "tool_call_id": call["id"],
                })
        elif node == TOOLS and isinstance(message, ToolMessage):
            await self.events.trace(self.step, node, "result", message.name or "", {
                "name": message.name, "result": text_of(message.content),
                "tool_call_id": message.tool_call_id, "status": message.status, "id": message.id,
            })


async def trace_cut(events: EventPublisher, live: LiveRun, step: int, closed: Closed) -> None:
    """What a cut wrote (worker/run/lifetime/stopping.py), as the trace events a step would have published."""
    for result in closed.tool_results:
        await events.trace(step, TOOLS, "result", result.name or "", {
            "name": result.name, "result": text_of(result.content),
            "tool_call_id": result.tool_call_id, "status": "stopped", "id": result.id,
        })
    for node in live.running.values():  # each task the cut ended (one per tool call)
        await events.trace(step, node, "leave", node, {"stopped": True})
