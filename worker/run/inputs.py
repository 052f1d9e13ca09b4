"""What a run gives the graph: a new message, a resume, or a decision on an approval; and the
configuration it streams with (the run's agent, kept on its checkpoints for the thread's next run).

Checked against the thread here, by the only writer, just before the graph starts
(worker/run/service.py): a second delivery, or a decision accepted twice, finds the
thread as the first one left it and is refused, never acted on again.
"""

from __future__ import annotations

import json
from typing import Any

from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command

from shared import tracing
from shared.contracts.assistants import CONFIG_KEY as AGENT_KEY
from shared.contracts.assistants import AgentConfig
from shared.contracts.codec import decode, encode
from shared.contracts.jobs import JobKind, RunJob
from shared.contracts.runs import RunErrorCode
from shared.storage.threads.interrupts import resume_value
from worker.run.outcome.ending import APPROVAL_PENDING

GraphInput = dict[str, Any] | Command[Any] | None


class NotResumable(Exception):
    """The job cannot continue the thread as it stands (nothing to resume, or a decision is pending)."""

    def __init__(self, message: str, code: str = RunErrorCode.RUN_NOT_RESUMABLE.value) -> None:
        super().__init__(message)
        self.code = code


async def graph_input(
    graph: CompiledStateGraph[Any, Any, Any, Any], job: RunJob, message: HumanMessage | None,
    at: RunnableConfig,
) -> GraphInput:
    """The input of ``job``'s graph stream at ``at``; raises :class:`NotResumable` when the thread
    cannot take it."""
    if message is not None:
        await _check_message(graph, job, at)
        return {"messages": [message]}
    if job.command is not None:
        # LangGraph's Command as the run's input: its update written, then its goto run (or, with
        # no goto, the graph's start). Not over a pending decision, which comes first.
        await _check_message(graph, job, at)
        return Command(goto=job.command.get("goto") or (), update=job.command.get("update"))
    return await _continuation(graph, job, at)


async def _check_message(
    graph: CompiledStateGraph[Any, Any, Any, Any], job: RunJob, at: RunnableConfig,
) -> None:
    # New input over a pending interrupt would silently discard it (LangGraph starts
    # a new step): the decision comes first.
    state = None if job.new_conversation else await graph.aget_state(at)
    if state is not None and job.checkpoint_id is not None and state.metadata is None:
        # Planned before a prune deleted it (shared/storage/threads/pruning.py): LangGraph would start an
        # empty thread there, the conversation's messages left behind.
        raise NotResumable(
            f"the checkpoint this run forks from ({job.checkpoint_id}) no longer exists (old checkpoints "
            "were pruned); your message was not recorded: send it again"
        )
    if state is not None and any(task.interrupts for task in state.tasks):
        raise NotResumable(
            "the conversation waits for a decision on its tool calls; your message was not "
            "recorded: send the decisions first, then the message again",
            APPROVAL_PENDING,
        )


async def _continuation(
    graph: CompiledStateGraph[Any, Any, Any, Any], job: RunJob, at: RunnableConfig,
) -> GraphInput:
    """A resume (None: the pending step runs again) or a decision (``Command(resume=...)``)."""
    state = await graph.aget_state(at)
    tracing.link_to(state.metadata)  # the run whose thread this one continues
    if not state.tasks:
        raise NotResumable("the conversation has no unfinished step to resume")
    waiting = any(task.interrupts for task in state.tasks)
    if job.kind is JobKind.DECIDE:
        # A second delivery, or a decision accepted twice, finds the interrupt answered and
        # does nothing.
        if not waiting:
            raise NotResumable("the conversation has no approval pending")
        # Each decision names who made it, for the decided answer's record (worker/agent/graph.py).
        decisions = [{**d, "by": job.started_by} if job.started_by else d for d in job.decisions or ()]
        return Command(resume=resume_value(state, decisions))
    if waiting:
        raise NotResumable("the conversation waits for an approval; decide it instead")
    return None


def run_config(
    job: RunJob, at: RunnableConfig, agent: AgentConfig | None, recursion_limit: int
) -> RunnableConfig:
    """The configuration of ``job``'s graph stream from ``at`` with ``agent`` (None: config/'s)."""
    # The assistant's configuration of the agent, for the graph (worker/agent/graph.py), and
    # on the run's checkpoints, where the thread's next run without one finds it.
    chosen = {AGENT_KEY: encode(agent)} if agent is not None else {}
    return {
        # With a checkpoint id, the run forks the thread there (an edit, a regenerate) or
        # continues the branch the conversation follows: its checkpoints are children of it.
        "configurable": {**at["configurable"], **chosen},
        # Stored on every checkpoint this run writes: exports can tell runs apart,
        # and start-up can tell whether the run's input was ever recorded. With
        # tracing, the run's traceparent too: a resume links to the run it continues.
        "metadata": {"run_id": job.run_id, **tracing.stamp(), **agent_metadata(agent)},
        "recursion_limit": recursion_limit,
    }


def agent_metadata(agent: AgentConfig | None) -> dict[str, str]:
    """``agent`` as a checkpoint's metadata keeps it for the thread's next run (LangGraph copies
    only plain values of a run's metadata onto its checkpoints: JSON text)."""
    return {AGENT_KEY: json.dumps(encode(agent))} if agent is not None else {}


async def thread_agent(
    graph: CompiledStateGraph[Any, Any, Any, Any], at: RunnableConfig
) -> AgentConfig | None:
    """The agent of the run that wrote the checkpoint ``at`` (a resume, a decision, the next
    message of a conversation begun with an assistant); None: config/'s."""
    saver = graph.checkpointer
    if not isinstance(saver, BaseCheckpointSaver):
        return None
    saved = await saver.aget_tuple(at)
    raw = (saved.metadata or {}).get(AGENT_KEY) if saved is not None else None
    return decode(AgentConfig, json.loads(raw)) if isinstance(raw, str) else None
