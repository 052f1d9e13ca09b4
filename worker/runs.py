"""A run's life in the worker: record it, stream the graph, record the outcome, notify.

Orderings that matter, and why:

* The run row is committed before the graph starts. A crash after that commit
  and before LangGraph's input checkpoint leaves a ``running`` row with no
  checkpoint of the run: start-up marks it interrupted and tells the user the
  message was never recorded.
* Persist, then notify: the outcome and ``message_count`` are committed before
  the conversation is released in Redis and the terminal event is published.
  A client that sees ``end`` can read the final state at once.
* ``durability="sync"``: every step's checkpoint is on disk before the next
  step starts, so a crash repeats at most the step in flight.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, cast

import structlog
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.errors import GraphDrained, GraphRecursionError
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import RunControl
from redis.asyncio import Redis
from redis.exceptions import RedisError

from shared.contracts import EventType, JobKind, RunErrorCode, RunJob, RunStatus
from shared.metrics import METRICS_KEY, RUNS_FINISHED, counter_field
from shared.queue import release_conversation
from shared.settings import Settings
from worker.events import EventPublisher
from worker.graph import AGENT, TOOLS
from worker.metrics import CallTimer
from worker.model import is_model_unavailable
from worker.progress import CANCEL_REASON, RunTracker
from worker.store import RunStore

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class Outcome:
    status: RunStatus
    code: str | None = None
    message: str | None = None


@dataclass(slots=True)
class RunService:
    settings: Settings
    redis: Redis
    store: RunStore
    graph: CompiledStateGraph[Any, Any, Any, Any]
    #: controls of the runs in progress, so a shutdown can drain them
    controls: dict[str, RunControl] = field(default_factory=dict)

    def thread_config(self, conversation_id: str) -> RunnableConfig:
        return {"configurable": {"thread_id": conversation_id}}

    def drain(self, reason: str = "shutdown") -> int:
        for control in self.controls.values():
            if control.drain_reason != CANCEL_REASON:  # a cancelled run stays cancelled
                control.request_drain(reason)
        return len(self.controls)

    async def execute(self, job: RunJob) -> str:
        """Run ``job`` once. A second delivery of the same job does nothing."""
        if (existing := await self.store.get_run(job.run_id)) is not None:
            # arq delivers at least once; this run already started (and crashed,
            # or finished). Running it again would repeat the user's message.
            log.warning("run.duplicate_delivery", status=existing.status)
            return f"skipped: already {existing.status}"
        started = time.monotonic()
        await self.store.start_run(job)
        log.info("run.started", kind=job.kind.value, waited_ms=round((time.time() - job.enqueued_at) * 1000))

        events = EventPublisher(
            self.redis, job.run_id,
            retention=self.settings.event_retention, max_len=self.settings.event_max_per_run,
        )
        await events.start()
        control = RunControl()
        self.controls[job.run_id] = control
        tracker = RunTracker(self.redis, job.run_id)
        try:
            try:
                await self._stream(job, events, control, tracker)
                outcome = Outcome(RunStatus.COMPLETED)
            finally:
                self.controls.pop(job.run_id, None)
        except GraphRecursionError:
            outcome = Outcome(
                RunStatus.FAILED, RunErrorCode.RECURSION_LIMIT,
                f"the agent took more than {self.settings.agent_recursion_limit} steps",
            )
        except GraphDrained as exc:
            if exc.reason == CANCEL_REASON:
                outcome = Outcome(RunStatus.CANCELLED)
            else:
                outcome = Outcome(
                    RunStatus.INTERRUPTED, RunErrorCode.INTERRUPTED,
                    "the worker shut down during the run; resume the conversation to finish it",
                )
        except NotResumable as exc:
            outcome = Outcome(RunStatus.FAILED, RunErrorCode.RUN_NOT_RESUMABLE, str(exc))
        except asyncio.CancelledError:
            # arq cancels the job (timeout, or a shutdown that could not drain).
            # Record it, shielded from the cancellation, then let it propagate.
            outcome = Outcome(RunStatus.INTERRUPTED, RunErrorCode.INTERRUPTED, "the run was cancelled")
            await asyncio.shield(self._conclude(job, outcome, events, tracker, started))
            raise
        except Exception as exc:
            if is_model_unavailable(exc):
                outcome = Outcome(
                    RunStatus.FAILED, RunErrorCode.MODEL_UNAVAILABLE,
                    f"the model {self.settings.ollama_model!r} at {self.settings.ollama_host} "
                    f"is not available: {type(exc).__name__}: {exc}",
                )
            else:
                log.exception("run.agent_failure")
                outcome = Outcome(
                    RunStatus.FAILED, RunErrorCode.AGENT_FAILURE, f"{type(exc).__name__}: {exc}"
                )
        await self._conclude(job, outcome, events, tracker, started)
        return outcome.status.value

    async def _conclude(
        self, job: RunJob, outcome: Outcome, events: EventPublisher, tracker: RunTracker, started: float
    ) -> None:
        steps = tracker.steps
        state = await self.graph.aget_state(self.thread_config(job.conversation_id))
        messages = state.values.get("messages", []) if state.values else []
        await self.store.finish_run(
            job.run_id, job.conversation_id,
            status=outcome.status, error_code=outcome.code, error_message=outcome.message,
            message_count=len(messages), pending_tasks=bool(state.tasks), step_count=steps,
        )
        duration = time.monotonic() - started
        log.info(
            "run.finished", status=outcome.status.value, error_code=outcome.code,
            steps=steps, duration_ms=round(duration * 1000),
            event_publish_failures=events.failures,
        )
        await tracker.close(duration)
        await notify_outcome(self.redis, events, job.conversation_id, job.run_id, outcome)

    async def _stream(
        self, job: RunJob, events: EventPublisher, control: RunControl, tracker: RunTracker
    ) -> int:
        def check(cancel: bool) -> None:
            # Takes effect at the next step boundary (LangGraph checks between steps).
            if cancel and not control.drain_requested:
                log.info("run.cancel_requested", step=tracker.steps)
                control.request_drain(CANCEL_REASON)

        config: RunnableConfig = {
            "configurable": {"thread_id": job.conversation_id},
            # Stored on every checkpoint this run writes: exports can tell runs apart,
            # and start-up can tell whether the run's input was ever recorded.
            "metadata": {"run_id": job.run_id},
            "recursion_limit": self.settings.agent_recursion_limit,
            "callbacks": [CallTimer(tracker.batch)],
        }
        graph_input: dict[str, Any] | None
        if job.kind is JobKind.RESUME:
            state = await self.graph.aget_state(self.thread_config(job.conversation_id))
            if not state.tasks:
                raise NotResumable("the conversation has no unfinished step to resume")
            graph_input = None
        else:
            # An id of its own, so the message is the same one in the input checkpoint
            # (``__start__``) and in the thread once the first step applies it.
            graph_input = {"messages": [HumanMessage(job.message or "", id=str(uuid.uuid4()))]}

        # Cancelled between being taken from the queue and now: stop before the first step.
        check(await tracker.cancel_requested())
        step = 0
        async for item in self.graph.astream(
            graph_input, config,
            stream_mode=["messages", "tasks"], durability="sync", control=control,
        ):
            mode, payload = cast(tuple[str, Any], item)
            if mode == "messages":
                chunk, meta = payload
                if meta.get("langgraph_node") == AGENT and isinstance(chunk, AIMessageChunk):
                    text = _text_of(chunk.content)
                    if text:
                        await events.token(text)
            elif mode == "tasks":
                node = payload["name"]
                if "input" in payload:
                    step += 1
                    check(await tracker.step_started(step, node))
                    await events.trace(step, node, "enter", node)
                    continue
                for message in (payload.get("result") or {}).get("messages", []):
                    if node == AGENT and isinstance(message, AIMessage):
                        for call in message.tool_calls:
                            await events.trace(step, node, "call", call["name"], {
                                "name": call["name"], "arguments": call["args"], "tool_call_id": call["id"],
                            })
                    elif node == TOOLS and isinstance(message, ToolMessage):
                        await events.trace(step, node, "result", message.name or "", {
                            "name": message.name, "result": _text_of(message.content),
                            "tool_call_id": message.tool_call_id, "status": message.status,
                        })
                leave: dict[str, Any] | None = {"error": payload["error"]} if payload.get("error") else None
                await events.trace(step, node, "leave", node, leave)
                check(await tracker.task_finished())
        return step


class NotResumable(Exception):
    pass


async def notify_outcome(
    redis: Redis, events: EventPublisher, conversation_id: str, run_id: str, outcome: Outcome
) -> None:
    """Free the conversation, then publish the run's terminal event (after the outcome is stored).

    A cancelled run ends with ``end`` like a completed one: it stopped as asked.
    """
    try:
        await release_conversation(redis, conversation_id, run_id)
    except RedisError as exc:
        # Start-up reconciliation frees conversations whose run has finished.
        log.warning("run.release_failed", error=str(exc))
    try:
        await redis.hincrby(METRICS_KEY, counter_field(RUNS_FINISHED, status=outcome.status.value))  # type: ignore[misc]
    except RedisError as exc:
        log.warning("run.metrics_failed", error=str(exc))
    if outcome.status in (RunStatus.COMPLETED, RunStatus.CANCELLED):
        await events.publish(EventType.END, {
            "conversation": conversation_id, "run": run_id, "status": outcome.status.value,
        })
    else:
        await events.publish(EventType.CHAT_ERROR, {
            "conversation": conversation_id, "run": run_id, "status": outcome.status.value,
            "code": outcome.code, "message": outcome.message,
        })


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part if isinstance(part, str) else str(part.get("text", ""))
            for part in content
            if isinstance(part, str) or (isinstance(part, dict) and part.get("type") == "text")
        )
    return str(content)
