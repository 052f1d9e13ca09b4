"""A run after its cut (worker/run/lifetime/stopping.py cuts it): its thread left valid and finished.

A checkpoint write the cut left open is rolled back, as a crash would; a fork cut before its
first checkpoint records nothing; otherwise the thread is closed (:func:`close_thread`) with
what the ledger recorded of each call in flight, and the cut is traced as events.
"""

from __future__ import annotations

from typing import Any, cast

import structlog
from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph.state import CompiledStateGraph

from shared.contracts.jobs import RunJob
from shared.contracts.runs import RunStatus
from shared.storage.checkpoints import end_failed_checkpoint_write
from shared.storage.threads.branch import thread_at
from worker.run.inputs import agent_metadata, thread_agent
from worker.run.lifetime.stopping import LiveRun, Recorded, close_thread
from worker.run.outcome.ending import Outcome
from worker.run.publish.events import EventPublisher
from worker.run.publish.stream import FinalState, trace_cut
from worker.tools.ledger.calls import Ledger
from worker.tools.ledger.records import CallRef

log = structlog.get_logger(__name__)


async def close_cut(
    graph: CompiledStateGraph[Any, Any, Any, Any], ledger: Ledger | None, job: RunJob, live: LiveRun,
    events: EventPublisher, steps: int,
) -> tuple[Outcome, FinalState | None]:
    """Leave the thread valid and finished after a cut of ``job``'s run; the outcome."""
    saver = cast("BaseCheckpointSaver[Any]", graph.checkpointer)
    # A checkpoint write cut between its statement and its commit leaves the saver's
    # transaction open (and the database's write lock held): roll it back, as a crash would.
    await end_failed_checkpoint_write(saver)
    thread: RunnableConfig = {"configurable": {"thread_id": job.conversation_id}}
    agent = job.agent or await thread_agent(graph, thread)
    # The checkpoint that closes the thread keeps the run's agent for the thread's next run.
    config: RunnableConfig = {**thread, "metadata": {"run_id": job.run_id, **agent_metadata(agent)}}
    if job.checkpoint_id is not None and not await _wrote(graph, job):
        # A fork cut before its first checkpoint: the thread's latest checkpoint is another
        # branch's, which the fork's message must not join. Nothing of the fork is recorded.
        log.info("run.cut_before_fork")
        return Outcome(RunStatus.CANCELLED), None
    try:
        closed = await close_thread(graph, config, live, _recorded(ledger, job.conversation_id))
    except Exception as exc:
        # The database refused: the thread stays as the cut left it (resumable, like
        # after a crash); the run was stopped all the same.
        log.warning("run.cut_not_closed", error=f"{type(exc).__name__}: {exc}")
        await end_failed_checkpoint_write(saver)
        return Outcome(RunStatus.CANCELLED), None
    await trace_cut(events, live, steps, closed)
    log.info("run.cut", node=live.node, stopped=closed.stopped, closed=closed.finished)
    status = RunStatus.CANCELLED if closed.stopped else RunStatus.COMPLETED
    return Outcome(status), FinalState(closed.message_count) if closed.finished else None


async def _wrote(graph: CompiledStateGraph[Any, Any, Any, Any], job: RunJob) -> bool:
    """Whether the thread's latest checkpoint is one ``job``'s run wrote."""
    latest = await graph.aget_state(thread_at(job.conversation_id))
    return (latest.metadata or {}).get("run_id") == job.run_id


def _recorded(ledger: Ledger | None, conversation_id: str) -> Recorded:
    """What the ledger recorded of a call of ``conversation_id`` (for :func:`close_thread`)."""

    async def recorded(message_id: str, tool_call_id: str, tool: str) -> ToolMessage | None:
        if ledger is None:
            return None
        return await ledger.recorded(CallRef(conversation_id, message_id, tool_call_id), tool)

    return recorded
