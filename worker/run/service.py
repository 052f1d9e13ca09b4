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
  (worker/run/lifetime/stopping.py): the cut is closed in the thread before the outcome.
* An approval: the graph stops at the interrupt of its ``approval`` node (the
  interrupt is on the checkpoint). The run ends ``waiting``, recorded like any
  outcome, then the conversation is released and the ``approval`` event and
  ``end`` (status ``waiting``) are published: a waiting conversation holds no
  worker and no claim. A ``decide`` job resumes it with ``Command(resume=...)``
  only if the interrupt is still pending, so a decision is acted on once.
* Release and the terminal event come in a ``finally``: whatever the database
  raised when the outcome was written (kept and retried, worker/run/outcome/outcomes.py),
  the client is told and the conversation is free.

Where to look, following one run (:meth:`RunService.execute` reads as these steps):

* it starts: :meth:`RunStart.record <worker.run.start.RunStart.record>` (the run row), after its
  turn was taken (worker/run/turns.py);
* what it gives the graph, and the configuration it streams with: worker/run/inputs.py;
* it is checkpointed: :meth:`~RunService._stream` (``durability="sync"``; the saver is
  opened in worker/resources.py);
* a tool call is recorded: the ledger (worker/tools/ledger/), from the graph's tools node;
* an event leaves the worker: worker/run/publish/stream.py, through worker/run/publish/events.py;
* it fails: worker/run/outcome/failures.py (the outcome each exception ends it with);
* it is cut: worker/run/cut.py (its thread left valid and finished);
* it ends: :meth:`~RunService._end`, through the one ending (worker/run/outcome/ending.py);
* a cancel, a drain, a lost lease reach it: ``LiveRuns`` (worker/run/lifetime/stopping.py).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, cast

import structlog
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import RunControl
from redis.asyncio import Redis

from shared import tracing
from shared.contracts.jobs import JobKind, RunJob
from shared.contracts.runs import RunErrorCode, RunStatus
from shared.settings import Settings
from shared.storage.leases import CURRENT_LEASE, Lease, LeaseLost
from shared.storage.threads.branch import thread_at
from worker.agent.memory import RUN_OWNER
from worker.metrics import collecting
from worker.run.cut import close_cut
from worker.run.inputs import graph_input, run_config, thread_agent
from worker.run.lifetime.stopping import LiveRun, LiveRuns
from worker.run.outcome.ending import Outcome, RunEnding, Thread
from worker.run.outcome.failures import failure_outcome
from worker.run.outcome.outcomes import UnrecordedOutcomes
from worker.run.publish.events import EventPublisher
from worker.run.publish.progress import RunTracker
from worker.run.publish.stream import FinalState, RunStream
from worker.run.start import RunStart
from worker.run.updates import apply_update
from worker.store import RunStore
from worker.tools.ledger.calls import Ledger

log = structlog.get_logger(__name__)


#: Why a run still in progress when the worker had to stop was ended.
ABANDONED = (
    "the worker shut down and the step in flight did not stop within SHUTDOWN_TIMEOUT; "
    "resume the conversation to finish it"
)
#: The outcomes whose run knows its final state (the thread is not read again to end it).
_FINAL_KNOWN = (RunStatus.COMPLETED, RunStatus.CANCELLED, RunStatus.WAITING)


@dataclass(slots=True, eq=False)
class Run:
    """One run being executed: its job, its events, its control and its progress."""

    job: RunJob
    #: when it was taken (``time.monotonic()``)
    started: float
    events: EventPublisher
    live: LiveRun
    tracker: RunTracker


@dataclass(slots=True)
class RunService:
    settings: Settings
    redis: Redis
    store: RunStore
    graph: CompiledStateGraph[Any, Any, Any, Any]
    #: the graph's ledger of tool calls (worker/tools/ledger/): a cut keeps what it recorded
    ledger: Ledger | None = None
    #: the runs in progress, so a cancel can cut them and a shutdown drain them
    live: LiveRuns = field(default_factory=LiveRuns)
    #: outcomes the database refused (busy, full, failing), retried until it takes them
    unrecorded: UnrecordedOutcomes = field(default_factory=UnrecordedOutcomes)
    #: the one place a run ends (worker/run/outcome/ending.py)
    ending: RunEnding = field(init=False)
    #: how a run starts: said taken, recorded once (worker/run/start.py)
    start: RunStart = field(init=False)

    def __post_init__(self) -> None:
        self.ending = RunEnding(self.settings, self.redis, self.store, self.graph, self.unrecorded)
        self.start = RunStart(self.redis, self.store, self.unrecorded, self.ending)

    @property
    def saver(self) -> BaseCheckpointSaver[Any]:
        """The graph's checkpointer (worker/resources.py always builds it with one)."""
        return cast("BaseCheckpointSaver[Any]", self.graph.checkpointer)

    async def execute(self, job: RunJob) -> str:
        """Run ``job`` once. A second delivery of the same job does nothing."""
        started = time.monotonic()
        await self.start.say_taken(job)
        skipped = await self.start.record(job)
        if skipped is not None:
            return skipped
        log.info("run.started", kind=job.kind.value, waited_ms=round((time.time() - job.enqueued_at) * 1000))
        run = self._prepare(job, started)
        try:
            outcome, final = await self._run(run)
        except LeaseLost as exc:
            # Another worker recorded the run interrupted and ended its stream: a write of
            # this one would contradict it (and the lease refuses it anyway).
            log.warning("run.dropped", reason=str(exc))
            return "dropped: lease lost"
        except asyncio.CancelledError:
            # arq cancels the job (timeout, or a shutdown that could not drain).
            # Record it, shielded from the cancellation, then let it propagate.
            cancelled = Outcome(RunStatus.INTERRUPTED, RunErrorCode.INTERRUPTED, "the run was cancelled")
            await asyncio.shield(self._end(run, cancelled))
            raise
        await self._end(run, outcome, final if outcome.status in _FINAL_KNOWN else None)
        return outcome.status.value

    # --- it starts ---------------------------------------------------------------------

    def _prepare(self, job: RunJob, started: float) -> Run:
        events = EventPublisher(
            self.redis, job.run_id,
            retention=self.settings.event_retention, max_len=self.settings.event_max_per_run,
            new_stream=True, coalesce=self.settings.event_coalesce_tokens,
            gather=self.settings.event_coalesce_ms / 1000,
        )
        # An id of its own, so the message is the same one in the input checkpoint
        # (``__start__``) and in the thread once the first step applies it.
        message = (
            HumanMessage(job.message or "", id=str(uuid.uuid4())) if job.kind is JobKind.RUN else None
        )
        tracker = RunTracker(self.redis, job.run_id, job.enqueued_at)
        run = Run(job, started, events, LiveRun(RunControl(), input=message), tracker)
        abandoned = Outcome(RunStatus.INTERRUPTED, RunErrorCode.INTERRUPTED, ABANDONED)
        run.live.abandon = lambda: self._end(run, abandoned)
        return run

    # --- it runs -----------------------------------------------------------------------

    async def _run(self, run: Run) -> tuple[Outcome, FinalState | None]:
        """Stream the graph; how the run ended (what it raised, as an outcome)."""
        if self.store.owner is not None:
            # PostgreSQL: every checkpoint write of the run checks its lease (the run's
            # task copies this context, and the lease with it).
            CURRENT_LEASE.set(Lease(run.job.run_id, self.store.owner))
        # The Store's tools act in the namespace of the conversation's owner (worker/agent/memory.py).
        RUN_OWNER.set(run.job.owner)
        try:
            return await self._run_listed(run)
        except LeaseLost:
            raise
        except Exception as exc:
            return await failure_outcome(exc, self.settings, self.saver), None

    async def _run_listed(self, run: Run) -> tuple[Outcome, FinalState | None]:
        """The graph's run, listed among the runs in progress, so a cancel reaches it."""
        self.live.add(run.job.run_id, run.live)
        try:
            final = await self._run_graph(run)
            if run.live.lease_lost:
                raise LeaseLost(run.job.run_id)
            if final is None:
                return await close_cut(
                    self.graph, self.ledger, run.job, run.live, run.events, run.tracker.steps
                )
            if final.requests is not None:
                return Outcome(RunStatus.WAITING), final
            return Outcome(RunStatus.COMPLETED), final
        finally:
            self.live.remove(run.job.run_id)

    async def _run_graph(self, run: Run) -> FinalState | None:
        """Stream the graph in a task of its own, which a cancel cuts; None when it was cut."""
        # Asked between being taken from the queue and being listed in ``live``: the
        # subscription could not tell this run, the marker does.
        if await run.tracker.cancel_requested():
            self.live.stop(run.job.run_id)
        if run.live.stopping:
            return None
        # The task copies this context, and the batch and the clock with it.
        with collecting(run.tracker.batch, run.tracker.clock):
            run.live.task = asyncio.create_task(self._stream(run), name=f"run:{run.job.run_id}")
        try:
            return await run.live.task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if run.live.stopping and not (current is not None and current.cancelling()):
                return None  # our cut, not arq cancelling this job
            raise

    async def _stream(self, run: Run) -> FinalState:
        """The graph's stream, each step checkpointed before the next begins, told as events."""
        job = run.job
        at = thread_at(job.conversation_id, job.checkpoint_id)
        if job.kind is JobKind.SWITCH:
            # The row names the branch now (worker/store.py start_run); the ending records its shape.
            branch = await self.graph.aget_state(at)
            return FinalState(len((branch.values or {}).get("messages", [])), pending=bool(branch.tasks))
        agent = job.agent or (None if job.new_conversation else await thread_agent(self.graph, at))
        config = run_config(job, at, agent, self.settings.agent_recursion_limit)
        if job.kind is JobKind.UPDATE:
            return await apply_update(self.graph, job, config)
        given = await graph_input(self.graph, job, run.live.input, at)
        stream = RunStream(run.events, run.live, run.tracker)
        stops = job.breakpoints or {}
        async for item in self.graph.astream(
            given, config,
            stream_mode=["messages", "tasks", "values"], durability="sync", control=run.live.control,
            interrupt_before=stops.get("before"), interrupt_after=stops.get("after"),
        ):
            await stream.tell(cast(tuple[str, Any], item))
        if stops and stream.final.requests is None:
            # Stopped at a breakpoint, or ended: the thread is resumable when tasks are left.
            stream.final.pending = bool((await self.graph.aget_state(thread_at(job.conversation_id))).tasks)
        return stream.final

    # --- it ends -----------------------------------------------------------------------

    async def _end(self, run: Run, outcome: Outcome, final: FinalState | None = None) -> None:
        """End the run through the one ending (worker/run/outcome/ending.py), with what it knows; once."""
        if run.live.ended:  # abandoned at shutdown: ended already
            return
        run.live.ended = True
        job, events, tracker = run.job, run.events, run.tracker
        try:
            ended = await self.ending.end(
                job.run_id, job.conversation_id, outcome, thread=_known_thread(final), events=events,
                steps=tracker.steps,
                # In the ending's round trip, after every progress write the run queued with its events.
                along=tracker.queue_close, duration=time.monotonic() - run.started,
                breakdown=tracker.clock.breakdown(),
            )
        except LeaseLost as exc:
            # Taken over while it ended: the new owner recorded it and told the client.
            log.warning("run.dropped", reason=str(exc))
            return
        tracing.annotate({"sophos.run.error_code": ended.code, "sophos.run.steps": tracker.steps})
        log.info(
            "run.finished", status=ended.status.value, error_code=ended.code,
            steps=tracker.steps, duration_ms=round((time.monotonic() - run.started) * 1000),
            event_publish_failures=events.failures, events=events.next_id - 1, event_writes=events.writes,
        )


def _known_thread(final: FinalState | None) -> Thread | None:
    """The thread's shape when the run knows it: it has nothing left to run (END, or a cut
    closed), or waits at its interrupt; None to have the ending read it."""
    if final is None:
        return None
    waiting = final.requests is not None
    return Thread(
        message_count=final.message_count, pending=waiting or final.pending, requests=final.requests,
    )
