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

Where to look, following one run (:meth:`RunService.execute` reads as these steps):

* it starts: :meth:`~RunService._record_start` (the run row), after its turn was taken
  (worker/run/turns.py);
* what it gives the graph: worker/run/inputs.py;
* it is checkpointed: :meth:`~RunService._stream` (``durability="sync"``; the saver is
  opened in worker/resources.py);
* a tool call is recorded: the ledger (worker/tools/ledger.py), from the graph's tools node;
* an event leaves the worker: worker/run/stream.py, through worker/run/events.py;
* it ends: :meth:`~RunService._end`, through the one ending (worker/run/ending.py);
* a cancel, a drain, a lost lease reach it: ``LiveRuns`` (worker/run/stopping.py).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, cast

import structlog
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.errors import GraphDrained, GraphRecursionError
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import RunControl
from redis.asyncio import Redis
from redis.exceptions import RedisError

from shared import tracing
from shared.contracts.assistants import CONFIG_KEY as AGENT_KEY
from shared.contracts.assistants import AgentConfig
from shared.contracts.codec import decode, encode
from shared.contracts.jobs import JobKind, RunJob
from shared.contracts.runs import RunErrorCode, RunStatus
from shared.redis.keys import TAKEN_SECONDS, taken_key
from shared.redis.queue import release_conversation
from shared.settings import Settings
from shared.storage.branch import thread_at
from shared.storage.checkpoints import end_failed_checkpoint_write
from shared.storage.leases import CURRENT_LEASE, Lease, LeaseLost
from shared.storage.rows import RunRow
from worker.agent.memory import RUN_OWNER
from worker.agent.model import is_model_unavailable
from worker.agent.model_check import unavailable_message
from worker.metrics import collecting
from worker.run.ending import Outcome, RunEnding, Thread
from worker.run.events import EventPublisher
from worker.run.inputs import NotResumable, graph_input
from worker.run.outcomes import UnrecordedOutcomes
from worker.run.progress import RunTracker
from worker.run.stopping import LiveRun, LiveRuns, Recorded, close_thread
from worker.run.stream import FinalState, RunStream, trace_cut
from worker.run.updates import apply_update
from worker.store import RunStore, is_database_unavailable
from worker.tools.ledger import CallRef, Ledger

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
    #: the graph's ledger of tool calls (worker/tools/ledger.py): a cut keeps what it recorded
    ledger: Ledger | None = None
    #: the runs in progress, so a cancel can cut them and a shutdown drain them
    live: LiveRuns = field(default_factory=LiveRuns)
    #: outcomes the database refused (busy, full, failing), retried until it takes them
    unrecorded: UnrecordedOutcomes = field(default_factory=UnrecordedOutcomes)
    #: the one place a run ends (worker/run/ending.py)
    ending: RunEnding = field(init=False)

    def __post_init__(self) -> None:
        self.ending = RunEnding(self.settings, self.redis, self.store, self.graph, self.unrecorded)

    @property
    def saver(self) -> BaseCheckpointSaver[Any]:
        """The graph's checkpointer (worker/resources.py always builds it with one)."""
        return cast("BaseCheckpointSaver[Any]", self.graph.checkpointer)

    async def execute(self, job: RunJob) -> str:
        """Run ``job`` once. A second delivery of the same job does nothing."""
        started = time.monotonic()
        await self._say_taken(job)
        skipped = await self._record_start(job)
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

    async def _say_taken(self, job: RunJob) -> None:
        if self.store.owner is None:
            return
        # Several workers: say who took it before anything can fail, so a live worker's
        # sweep frees the conversation if this one dies before recording the run.
        try:
            await self.redis.set(taken_key(job.run_id), self.store.owner, ex=TAKEN_SECONDS)
        except RedisError as exc:
            log.warning("run.taken_unrecorded", error=str(exc))

    async def _record_start(self, job: RunJob) -> str | None:
        """Record the run ``running``; None, or what the job returns instead of running it (it
        could not be recorded, or it was recorded by an earlier delivery)."""
        try:
            # An earlier run's outcome goes first: this run must not overtake it.
            if not await self.unrecorded.flush():
                raise DatabaseBusy("earlier outcomes are still waiting to be recorded")
            existing = await self.store.start_run(job)
        except Exception as exc:
            # Busy, full, malformed, or anything else: the run is not recorded, and the
            # client must still be told and the conversation freed (``_refuse``).
            existing = await self._recorded_before(job, exc)
            if existing is None:
                await self._refuse(job, exc)
                return RunStatus.FAILED.value
        return None if existing is None else await self._skip(job, existing)

    async def _recorded_before(self, job: RunJob, exc: Exception) -> RunRow | None:
        """The run's row after its start failed: a second delivery of a recorded run is skipped,
        busy database or not (a reader is never locked out in WAL mode)."""
        if not is_database_unavailable(exc) and not isinstance(exc, DatabaseBusy):
            log.error("run.start_failed", error=f"{type(exc).__name__}: {exc}", exc_info=exc)
        try:
            return await self.store.get_run(job.run_id)
        except Exception as again:
            log.warning("run.lookup_failed", error=f"{type(again).__name__}: {again}")
            return None

    async def _skip(self, job: RunJob, existing: RunRow) -> str:
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

    def _prepare(self, job: RunJob, started: float) -> Run:
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
            return await self._failure(exc), None

    async def _run_listed(self, run: Run) -> tuple[Outcome, FinalState | None]:
        """The graph's run, listed among the runs in progress, so a cancel reaches it."""
        self.live.add(run.job.run_id, run.live)
        try:
            final = await self._run_graph(run)
            if run.live.lease_lost:
                raise LeaseLost(run.job.run_id)
            if final is None:
                return await self._close_cut(run)
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
        agent = job.agent or (None if job.new_conversation else await self._thread_agent(at))
        config = self._config(job, at, agent)
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

    def _config(self, job: RunJob, at: RunnableConfig, agent: AgentConfig | None) -> RunnableConfig:
        # The assistant's configuration of the agent, for the graph (worker/agent/graph.py), and
        # on the run's checkpoints, where the thread's next run without one finds it.
        # (LangGraph copies only plain values of a run's metadata onto its checkpoints: JSON text.)
        chosen = {AGENT_KEY: encode(agent)} if agent is not None else {}
        recorded = {AGENT_KEY: json.dumps(encode(agent))} if agent is not None else {}
        return {
            # With a checkpoint id, the run forks the thread there (an edit, a regenerate) or
            # continues the branch the conversation follows: its checkpoints are children of it.
            "configurable": {**at["configurable"], **chosen},
            # Stored on every checkpoint this run writes: exports can tell runs apart,
            # and start-up can tell whether the run's input was ever recorded. With
            # tracing, the run's traceparent too: a resume links to the run it continues.
            "metadata": {"run_id": job.run_id, **tracing.stamp(), **recorded},
            "recursion_limit": self.settings.agent_recursion_limit,
        }

    async def _thread_agent(self, at: RunnableConfig) -> AgentConfig | None:
        """The agent of the run that wrote the checkpoint this run starts from (a resume, a
        decision, the next message of a conversation begun with an assistant); None: config/'s."""
        saver = self.graph.checkpointer
        if not isinstance(saver, BaseCheckpointSaver):
            return None
        saved = await saver.aget_tuple(at)
        raw = (saved.metadata or {}).get(AGENT_KEY) if saved is not None else None
        return decode(AgentConfig, json.loads(raw)) if isinstance(raw, str) else None

    async def _failure(self, exc: Exception) -> Outcome:
        """The outcome of a run whose graph raised ``exc``."""
        if isinstance(exc, GraphRecursionError):
            return Outcome(
                RunStatus.FAILED, RunErrorCode.RECURSION_LIMIT,
                f"the agent took more than {self.settings.agent_recursion_limit} steps",
            )
        if isinstance(exc, GraphDrained):
            return Outcome(
                RunStatus.INTERRUPTED, RunErrorCode.INTERRUPTED,
                "the worker shut down during the run; resume the conversation to finish it",
            )
        if isinstance(exc, NotResumable):
            return Outcome(RunStatus.FAILED, exc.code, str(exc))
        if is_model_unavailable(exc):
            return Outcome(
                RunStatus.FAILED, RunErrorCode.MODEL_UNAVAILABLE, unavailable_message(exc, self.settings),
            )
        if is_database_unavailable(exc):
            log.warning("run.database_unavailable", error=str(exc))
            await self._end_failed_checkpoint_write()
            return Outcome(
                RunStatus.FAILED, RunErrorCode.DATABASE_UNAVAILABLE,
                f"the database could not be written ({exc}); the steps before are kept, "
                "resume the conversation once it can be written again",
            )
        log.exception("run.agent_failure", exc_info=exc)
        return Outcome(RunStatus.FAILED, RunErrorCode.AGENT_FAILURE, f"{type(exc).__name__}: {exc}")

    # --- it is cut ---------------------------------------------------------------------

    async def _close_cut(self, run: Run) -> tuple[Outcome, FinalState | None]:
        """Leave the thread valid and finished after a cut (worker/run/stopping.py); the outcome."""
        job, live = run.job, run.live
        # A checkpoint write cut between its statement and its commit leaves the saver's
        # transaction open (and the database's write lock held): roll it back, as a crash would.
        await self._end_failed_checkpoint_write()
        thread: RunnableConfig = {"configurable": {"thread_id": job.conversation_id}}
        agent = job.agent or await self._thread_agent(thread)
        # The checkpoint that closes the thread keeps the run's agent for the thread's next run.
        config: RunnableConfig = {
            **thread,
            "metadata": {"run_id": job.run_id, **({AGENT_KEY: json.dumps(encode(agent))} if agent else {})},
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
        await trace_cut(run.events, live, run.tracker.steps, closed)
        log.info("run.cut", node=live.node, stopped=closed.stopped, closed=closed.finished)
        status = RunStatus.CANCELLED if closed.stopped else RunStatus.COMPLETED
        return Outcome(status), FinalState(closed.message_count) if closed.finished else None

    async def _wrote(self, job: RunJob) -> bool:
        """Whether the thread's latest checkpoint is one ``job``'s run wrote."""
        latest = await self.graph.aget_state(thread_at(job.conversation_id))
        return (latest.metadata or {}).get("run_id") == job.run_id

    def _recorded(self, conversation_id: str) -> Recorded:
        """What the ledger recorded of a call of ``conversation_id`` (for :func:`close_thread`)."""
        ledger = self.ledger

        async def recorded(message_id: str, tool_call_id: str, tool: str) -> ToolMessage | None:
            if ledger is None:
                return None
            return await ledger.recorded(CallRef(conversation_id, message_id, tool_call_id), tool)

        return recorded

    async def _end_failed_checkpoint_write(self) -> None:
        await end_failed_checkpoint_write(self.saver)

    # --- it ends -----------------------------------------------------------------------

    async def _end(self, run: Run, outcome: Outcome, final: FinalState | None = None) -> None:
        """End the run through the one ending (worker/run/ending.py), with what the run knows; once."""
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


class DatabaseBusy(Exception):
    pass
