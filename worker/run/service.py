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
* The graph streams in a task of its own, so a cancel can cut it mid-step
  (worker/run/stopping.py): the cut is closed in the thread before the outcome.
* An approval: the graph stops at the interrupt of its ``approval`` node (the
  interrupt is on the checkpoint). The run ends ``waiting``, recorded like any
  outcome, then the conversation is released and the ``approval`` event and
  ``end`` (status ``waiting``) are published: a waiting conversation holds no
  worker and no claim. A ``decide`` job resumes it with ``Command(resume=...)``
  only if the interrupt is still pending, so a decision is acted on once.
* Release and the terminal event come in a ``finally``: whatever the database
  raised when the outcome was written (kept and retried, worker/run/outcomes.py),
  the client is told and the conversation is free.
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
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.errors import GraphDrained, GraphRecursionError
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import RunControl
from langgraph.types import Command
from redis.asyncio import Redis
from redis.exceptions import RedisError

from shared import tracing
from shared.contracts.events import text_of
from shared.contracts.jobs import JobKind, RunJob
from shared.contracts.runs import RunErrorCode, RunStatus
from shared.redis.keys import taken_key
from shared.redis.queue import release_conversation
from shared.settings import Settings
from shared.storage.checkpoints import end_failed_checkpoint_write
from shared.storage.leases import CURRENT_LEASE, Lease, LeaseLost
from shared.storage.thread import resume_value
from worker.agent.graph import AGENT, TOOLS
from worker.agent.model import is_model_unavailable
from worker.agent.model_check import unavailable_message
from worker.metrics import collecting
from worker.run.ending import APPROVAL_PENDING, Outcome, RunEnding, Thread
from worker.run.events import EventPublisher
from worker.run.outcomes import UnrecordedOutcomes
from worker.run.progress import CancelSignals, RunTracker
from worker.run.stopping import Closed, LiveRun, Recorded, close_thread
from worker.store import RunStore, is_database_unavailable
from worker.tools.ledger import CallRef, Ledger

log = structlog.get_logger(__name__)


#: How long the record of who took a run is kept: past any wait for its row.
TAKEN_SECONDS = 3600
#: Why a run still in progress when the worker had to stop was ended.
ABANDONED = (
    "the worker shut down and the step in flight did not stop within SHUTDOWN_TIMEOUT; "
    "resume the conversation to finish it"
)
#: The outcomes whose run knows its final state (the thread is not read again to end it).
_FINAL_KNOWN = (RunStatus.COMPLETED, RunStatus.CANCELLED, RunStatus.WAITING)


@dataclass(slots=True)
class RunService:
    settings: Settings
    redis: Redis
    store: RunStore
    graph: CompiledStateGraph[Any, Any, Any, Any]
    #: the graph's ledger of tool calls (worker/tools/ledger.py): a cut keeps what it recorded
    ledger: Ledger | None = None
    #: the runs in progress, so a cancel can cut them and a shutdown drain them
    live: dict[str, LiveRun] = field(default_factory=dict)
    #: outcomes the database refused (busy, full, failing), retried until it takes them
    unrecorded: UnrecordedOutcomes = field(default_factory=UnrecordedOutcomes)
    #: the one place a run ends (worker/run/ending.py)
    ending: RunEnding = field(init=False)

    def __post_init__(self) -> None:
        self.ending = RunEnding(self.settings, self.redis, self.store, self.graph, self.unrecorded)

    def thread_config(self, conversation_id: str, checkpoint_id: str | None = None) -> RunnableConfig:
        """The thread's config: at its latest checkpoint, or at ``checkpoint_id`` (a branch's head,
        or where an edit forks it)."""
        if checkpoint_id is None:
            return {"configurable": {"thread_id": conversation_id}}
        return {"configurable": {"thread_id": conversation_id, "checkpoint_id": checkpoint_id}}

    def _recorded(self, conversation_id: str) -> Recorded:
        """What the ledger recorded of a call of ``conversation_id`` (for :func:`close_thread`)."""
        ledger = self.ledger

        async def recorded(message_id: str, tool_call_id: str, tool: str) -> ToolMessage | None:
            if ledger is None:
                return None
            return await ledger.recorded(CallRef(conversation_id, message_id, tool_call_id), tool)

        return recorded

    @property
    def saver(self) -> BaseCheckpointSaver[Any]:
        """The graph's checkpointer (worker/resources.py always builds it with one)."""
        return cast("BaseCheckpointSaver[Any]", self.graph.checkpointer)

    def drain(self, reason: str = "shutdown") -> int:
        for live in self.live.values():
            if not live.stopping:  # a run being cut for a cancel stays cancelled
                live.control.request_drain(reason)
        return len(self.live)

    def stop(self, run_id: str) -> None:
        """Cut ``run_id`` now if it is in progress here (a cancel was asked)."""
        live = self.live.get(run_id)
        if live is not None and live.stop():
            log.info("run.cancel_requested", run_id=run_id, node=live.node)

    async def abandon(self) -> int:
        """End every run still in progress ``interrupted`` now: SIGTERM past ``SHUTDOWN_TIMEOUT``.

        Its step did not reach a boundary in time (a call that does not yield to
        cancellation, a tool that ignores it): the run is recorded and its stream ended
        before the worker closes its stores, whatever the step goes on doing.
        """
        late = [live for live in self.live.values() if live.abandon is not None and not live.ended]
        for live in late:
            try:
                await live.abandon()  # type: ignore[misc]
            except Exception:
                log.exception("run.abandon_failed")
        return len(late)

    def lose(self, run_id: str) -> None:
        """Drop ``run_id``: its lease is another worker's now (worker/run/leases.py); nothing more is
        written."""
        live = self.live.get(run_id)
        if live is not None:
            live.lease_lost = True
            live.stop()

    def cancel_signals(self) -> CancelSignals:
        """The worker's one subscription to cancels (an async context manager, for its life)."""
        return CancelSignals(self.redis, self.stop, lambda: list(self.live))

    async def execute(self, job: RunJob) -> str:
        """Run ``job`` once. A second delivery of the same job does nothing."""
        started = time.monotonic()
        if self.store.owner is not None:
            # Several workers: say who took it before anything can fail, so a live worker's
            # sweep frees the conversation if this one dies before recording the run.
            try:
                await self.redis.set(taken_key(job.run_id), self.store.owner, ex=TAKEN_SECONDS)
            except RedisError as exc:
                log.warning("run.taken_unrecorded", error=str(exc))
        try:
            # An earlier run's outcome goes first: this run must not overtake it.
            if not await self.unrecorded.flush():
                raise DatabaseBusy("earlier outcomes are still waiting to be recorded")
            existing = await self.store.start_run(job)
        except Exception as exc:
            # Busy, full, malformed, or anything else: the run is not recorded, and the
            # client must still be told and the conversation freed (``_refuse``).
            if not is_database_unavailable(exc) and not isinstance(exc, DatabaseBusy):
                log.error("run.start_failed", error=f"{type(exc).__name__}: {exc}", exc_info=True)
            # A second delivery of a recorded run is skipped below, busy database or not
            # (a reader is never locked out in WAL mode).
            try:
                existing = await self.store.get_run(job.run_id)
            except Exception as again:
                log.warning("run.lookup_failed", error=f"{type(again).__name__}: {again}")
                existing = None
            if existing is None:
                await self._refuse(job, exc)
                return RunStatus.FAILED.value
        if existing is not None:
            # arq delivers at least once; this run already started (and crashed,
            # or finished). Running it again would repeat the user's message.
            log.warning("run.duplicate_delivery", status=existing.status)
            if RunStatus(existing.status).finished:
                try:
                    # Were it still named as the conversation's run, nothing would free it.
                    await release_conversation(self.redis, job.conversation_id, job.run_id)
                except RedisError as exc:
                    log.warning("run.release_failed", error=str(exc))
            return f"skipped: already {existing.status}"
        log.info("run.started", kind=job.kind.value, waited_ms=round((time.time() - job.enqueued_at) * 1000))

        events = EventPublisher(
            self.redis, job.run_id,
            retention=self.settings.event_retention, max_len=self.settings.event_max_per_run,
            new_stream=True,
        )
        # An id of its own, so the message is the same one in the input checkpoint
        # (``__start__``) and in the thread once the first step applies it.
        message = (
            HumanMessage(job.message or "", id=str(uuid.uuid4())) if job.kind is JobKind.RUN else None
        )
        live = LiveRun(RunControl(), input=message)
        tracker = RunTracker(self.redis, job.run_id, job.enqueued_at)

        async def conclude(outcome: Outcome, final: FinalState | None = None) -> None:
            if live.ended:  # abandoned at shutdown: ended already
                return
            live.ended = True
            await self._conclude(job, outcome, events, tracker, started, final)

        live.abandon = lambda: conclude(Outcome(RunStatus.INTERRUPTED, RunErrorCode.INTERRUPTED, ABANDONED))
        final: FinalState | None = None
        if self.store.owner is not None:
            # PostgreSQL: every checkpoint write of the run checks its lease (the run's
            # task copies this context, and the lease with it).
            CURRENT_LEASE.set(Lease(job.run_id, self.store.owner))
        try:
            try:
                # From here on a cancel reaches the run (RunService.stop).
                self.live[job.run_id] = live
                final = await self._run_graph(job, events, live, tracker)
                if live.lease_lost:
                    raise LeaseLost(job.run_id)
                if final is None:
                    outcome, final = await self._close_cut(job, events, live, tracker)
                elif final.requests is not None:
                    outcome = Outcome(RunStatus.WAITING)
                else:
                    outcome = Outcome(RunStatus.COMPLETED)
            finally:
                self.live.pop(job.run_id, None)
        except LeaseLost as exc:
            # Another worker recorded the run interrupted and ended its stream: a write of
            # this one would contradict it (and the lease refuses it anyway).
            log.warning("run.dropped", reason=str(exc))
            return "dropped: lease lost"
        except GraphRecursionError:
            outcome = Outcome(
                RunStatus.FAILED, RunErrorCode.RECURSION_LIMIT,
                f"the agent took more than {self.settings.agent_recursion_limit} steps",
            )
        except GraphDrained:
            outcome = Outcome(
                RunStatus.INTERRUPTED, RunErrorCode.INTERRUPTED,
                "the worker shut down during the run; resume the conversation to finish it",
            )
        except NotResumable as exc:
            outcome = Outcome(RunStatus.FAILED, exc.code, str(exc))
        except asyncio.CancelledError:
            # arq cancels the job (timeout, or a shutdown that could not drain).
            # Record it, shielded from the cancellation, then let it propagate.
            outcome = Outcome(RunStatus.INTERRUPTED, RunErrorCode.INTERRUPTED, "the run was cancelled")
            await asyncio.shield(conclude(outcome))
            raise
        except Exception as exc:
            if is_model_unavailable(exc):
                outcome = Outcome(
                    RunStatus.FAILED, RunErrorCode.MODEL_UNAVAILABLE, unavailable_message(exc, self.settings),
                )
            elif is_database_unavailable(exc):
                log.warning("run.database_unavailable", error=str(exc))
                await self._end_failed_checkpoint_write()
                outcome = Outcome(
                    RunStatus.FAILED, RunErrorCode.DATABASE_UNAVAILABLE,
                    f"the database could not be written ({exc}); the steps before are kept, "
                    "resume the conversation once it can be written again",
                )
            else:
                log.exception("run.agent_failure")
                outcome = Outcome(
                    RunStatus.FAILED, RunErrorCode.AGENT_FAILURE, f"{type(exc).__name__}: {exc}"
                )
        await conclude(outcome, final if outcome.status in _FINAL_KNOWN else None)
        return outcome.status.value

    async def _conclude(
        self, job: RunJob, outcome: Outcome, events: EventPublisher, tracker: RunTracker, started: float,
        final: FinalState | None = None,
    ) -> None:
        """End the run through the one ending (worker/run/ending.py), with what the run knows."""
        duration = time.monotonic() - started
        thread = None
        if final is not None:
            # The thread has nothing left to run (END, or a cut closed), or waits at its
            # interrupt: its shape is at hand, no checkpoint read needed.
            waiting = final.requests is not None
            thread = Thread(
                message_count=final.message_count, pending=waiting or final.pending, requests=final.requests,
            )
        try:
            ended = await self.ending.end(
                job.run_id, job.conversation_id, outcome, thread=thread, events=events, steps=tracker.steps,
                # In the ending's round trip, after every progress write the run queued with its events.
                along=tracker.queue_close, duration=duration, breakdown=tracker.clock.breakdown(),
            )
        except LeaseLost as exc:
            # Taken over while it ended: the new owner recorded it and told the client.
            log.warning("run.dropped", reason=str(exc))
            return
        tracing.annotate({"sophos.run.error_code": ended.code, "sophos.run.steps": tracker.steps})
        log.info(
            "run.finished", status=ended.status.value, error_code=ended.code,
            steps=tracker.steps, duration_ms=round((time.monotonic() - started) * 1000),
            event_publish_failures=events.failures, events=events.next_id - 1, event_writes=events.writes,
        )

    async def _run_graph(
        self, job: RunJob, events: EventPublisher, live: LiveRun, tracker: RunTracker
    ) -> FinalState | None:
        """Stream the graph in a task of its own, which a cancel cuts; None when it was cut."""
        # Asked between being taken from the queue and being listed in ``live``: the
        # subscription could not tell this run, the marker does.
        if await tracker.cancel_requested():
            self.stop(job.run_id)
        if live.stopping:
            return None
        # The task copies this context, and the batch and the clock with it.
        with collecting(tracker.batch, tracker.clock):
            live.task = asyncio.create_task(
                self._stream(job, events, live, tracker), name=f"run:{job.run_id}"
            )
        try:
            return await live.task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if live.stopping and not (current is not None and current.cancelling()):
                return None  # our cut, not arq cancelling this job
            raise

    async def _close_cut(
        self, job: RunJob, events: EventPublisher, live: LiveRun, tracker: RunTracker
    ) -> tuple[Outcome, FinalState | None]:
        """Leave the thread valid and finished after a cut (worker/run/stopping.py); the outcome."""
        # A checkpoint write cut between its statement and its commit leaves the saver's
        # transaction open (and the database's write lock held): roll it back, as a crash would.
        await self._end_failed_checkpoint_write()
        config: RunnableConfig = {
            "configurable": {"thread_id": job.conversation_id}, "metadata": {"run_id": job.run_id},
        }
        if job.checkpoint_id is not None and not await self._wrote(job):
            # A fork cut before its first checkpoint: the thread's latest checkpoint is another
            # branch's, which the fork's message must not join. Nothing of the fork is recorded.
            log.info("run.cut_before_fork")
            return Outcome(RunStatus.CANCELLED), None
        try:
            closed = await close_thread(self.graph, config, live, self._recorded(job.conversation_id))
        except Exception as exc:
            # The database refused: the thread stays as the cut left it (resumable, like
            # after a crash); the run was stopped all the same.
            log.warning("run.cut_not_closed", error=f"{type(exc).__name__}: {exc}")
            await self._end_failed_checkpoint_write()
            return Outcome(RunStatus.CANCELLED), None
        await self._trace_cut(events, live, tracker, closed)
        log.info("run.cut", node=live.node, stopped=closed.stopped, closed=closed.finished)
        status = RunStatus.CANCELLED if closed.stopped else RunStatus.COMPLETED
        return Outcome(status), FinalState(closed.message_count) if closed.finished else None

    async def _wrote(self, job: RunJob) -> bool:
        """Whether the thread's latest checkpoint is one ``job``'s run wrote."""
        latest = await self.graph.aget_state(self.thread_config(job.conversation_id))
        return (latest.metadata or {}).get("run_id") == job.run_id

    async def _trace_cut(
        self, events: EventPublisher, live: LiveRun, tracker: RunTracker, closed: Closed
    ) -> None:
        """What the cut wrote, as the trace events a step would have published."""
        step = tracker.steps
        for result in closed.tool_results:
            await events.trace(step, TOOLS, "result", result.name or "", {
                "name": result.name, "result": text_of(result.content),
                "tool_call_id": result.tool_call_id, "status": "stopped",
            })
        for node in live.running.values():  # each task the cut ended (one per tool call)
            await events.trace(step, node, "leave", node, {"stopped": True})

    async def _stream(
        self, job: RunJob, events: EventPublisher, live: LiveRun, tracker: RunTracker
    ) -> FinalState:
        at = self.thread_config(job.conversation_id, job.checkpoint_id)
        if job.kind is JobKind.SWITCH:
            # The row names the branch now (worker/store.py start_run); the ending records its shape.
            branch = await self.graph.aget_state(at)
            return FinalState(len((branch.values or {}).get("messages", [])), pending=bool(branch.tasks))
        config: RunnableConfig = {
            # With a checkpoint id, the run forks the thread there (an edit, a regenerate) or
            # continues the branch the conversation follows: its checkpoints are children of it.
            "configurable": at["configurable"],
            # Stored on every checkpoint this run writes: exports can tell runs apart,
            # and start-up can tell whether the run's input was ever recorded. With
            # tracing, the run's traceparent too: a resume links to the run it continues.
            "metadata": {"run_id": job.run_id, **tracing.stamp()},
            "recursion_limit": self.settings.agent_recursion_limit,
        }
        graph_input: dict[str, Any] | Command[Any] | None = None
        if live.input is not None:
            # New input over a pending interrupt would silently discard it (LangGraph starts
            # a new step): the decision comes first. Checked here, by the only writer.
            state = None if job.new_conversation else await self.graph.aget_state(at)
            if state is not None and any(task.interrupts for task in state.tasks):
                raise NotResumable(
                    "the conversation waits for a decision on its tool calls; your message was not "
                    "recorded: send the decisions first, then the message again",
                    APPROVAL_PENDING,
                )
            graph_input = {"messages": [live.input]}
        else:
            state = await self.graph.aget_state(at)
            tracing.link_to(state.metadata)  # the run whose thread this one continues
            if not state.tasks:
                raise NotResumable("the conversation has no unfinished step to resume")
            waiting = any(task.interrupts for task in state.tasks)
            if job.kind is JobKind.DECIDE:
                # Checked here, by the only writer: a second delivery, or a decision
                # accepted twice, finds the interrupt answered and does nothing.
                if not waiting:
                    raise NotResumable("the conversation has no approval pending")
                graph_input = Command(resume=resume_value(state, list(job.decisions or ())))
            elif waiting:
                raise NotResumable("the conversation waits for an approval; decide it instead")

        step = 0
        final = FinalState()
        async for item in self.graph.astream(
            graph_input, config,
            stream_mode=["messages", "tasks", "values"], durability="sync", control=live.control,
        ):
            mode, payload = cast(tuple[str, Any], item)
            if mode == "values":
                # The whole state after each step (a reference, not a copy): the last one
                # is the thread's final state, so the outcome needs no checkpoint read.
                final.message_count = len(payload.get("messages", []))
            elif mode == "messages":
                chunk, meta = payload
                if meta.get("langgraph_node") == AGENT and isinstance(chunk, AIMessageChunk):
                    text = text_of(chunk.content)
                    if text:
                        live.streamed(text)
                        tracker.token()
                        await events.token(text)
            elif mode == "tasks":
                node = payload["name"]
                if "input" in payload:
                    # A tools step has a task per call (worker/agent/graph.py): one step, several enters.
                    if live.started(node, payload.get("id") or ""):
                        step += 1
                        tracker.step_started(step, node, events)
                    await events.trace(step, node, "enter", node)
                    continue
                result = None if payload.get("error") else payload.get("result")
                live.finished(node, payload.get("id") or "", result)
                if payload.get("interrupts"):
                    # One interrupt per turn (worker/agent/graph.py): its requests are the approval's.
                    # (The tasks stream gives each interrupt as a dict: {"value", "id"}.)
                    first = payload["interrupts"][0]
                    value = first["value"] if isinstance(first, dict) else first.value
                    final.requests = list(value["requests"])
                for message in (payload.get("result") or {}).get("messages", []):
                    if node == AGENT and isinstance(message, AIMessage):
                        for call in message.tool_calls:
                            await events.trace(step, node, "call", call["name"], {
                                "name": call["name"], "arguments": call["args"], "tool_call_id": call["id"],
                            })
                    elif node == TOOLS and isinstance(message, ToolMessage):
                        await events.trace(step, node, "result", message.name or "", {
                            "name": message.name, "result": text_of(message.content),
                            "tool_call_id": message.tool_call_id, "status": message.status,
                        })
                leave: dict[str, Any] | None = {"error": payload["error"]} if payload.get("error") else None
                await events.trace(step, node, "leave", node, leave)
                tracker.task_finished(events)
        return final

    async def _refuse(self, job: RunJob, exc: BaseException) -> None:
        """The run could not even be recorded: tell the client and free the conversation."""
        log.warning("run.not_recorded", error=str(exc))
        again = "resume again" if job.kind is JobKind.RESUME else "send it again"
        outcome = Outcome(
            RunStatus.FAILED, RunErrorCode.DATABASE_UNAVAILABLE,
            f"the database could not be written ({exc}); nothing of this request was recorded, "
            f"{again} once it can be written",
        )
        # Its Redis description is its only record: the API answers for the run from it.
        await self.ending.end(job.run_id, job.conversation_id, outcome, thread=Thread(), recorded=False)

    async def _end_failed_checkpoint_write(self) -> None:
        await end_failed_checkpoint_write(self.saver)


@dataclass(slots=True)
class FinalState:
    message_count: int = 0
    #: set when the graph stopped at an approval: the calls waiting for a decision
    requests: list[dict[str, Any]] | None = None
    #: a switch's branch has tasks left to run (its conversation is resumable)
    pending: bool = False


class NotResumable(Exception):
    """The job cannot continue the thread as it stands (nothing to resume, or a decision is pending)."""

    def __init__(self, message: str, code: str = RunErrorCode.RUN_NOT_RESUMABLE.value) -> None:
        super().__init__(message)
        self.code = code


class DatabaseBusy(Exception):
    pass
