"""A run's vocabulary, the same in the worker, the API and the thread: its statuses, its error
codes, the agent graph's nodes, and the marks a run leaves on a thread's messages."""

from __future__ import annotations

import enum

# --- the agent graph's nodes (worker/agent/graph.py), as the thread and the protocol's events name them

AGENT = "agent"
TOOLS = "tools"
#: asks the user to approve, edit or reject the turn's tool calls (worker/agent/graph.py)
APPROVAL = "approval"

# --- statuses and error codes ----------------------------------------------------


class RunStatus(enum.StrEnum):
    QUEUED = "queued"  # in Redis only
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    CANCELLED = "cancelled"  # by POST /api/runs/{id}/cancel, queued or running
    #: paused for an approval of tool calls: over (it holds nothing), a decision starts the next run
    WAITING = "waiting"

    @property
    def finished(self) -> bool:
        return self in (
            RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.INTERRUPTED, RunStatus.CANCELLED,
            RunStatus.WAITING,
        )


class RunErrorCode(enum.StrEnum):
    MODEL_UNAVAILABLE = "MODEL_UNAVAILABLE"
    RECURSION_LIMIT = "RECURSION_LIMIT"
    AGENT_FAILURE = "AGENT_FAILURE"
    INTERRUPTED = "INTERRUPTED"
    DATABASE_UNAVAILABLE = "DATABASE_UNAVAILABLE"
    RUN_NOT_RESUMABLE = "RUN_NOT_RESUMABLE"


# --- marks on a thread's messages ---------------------------------------------------

#: ``response_metadata`` key set on the messages a cancel wrote into a thread (the
#: answer cut short, the tool results of calls cut short)
STOPPED_MARK = "stopped"
#: ``response_metadata`` key of an answer whose tool calls needed approval: each call's decision
APPROVALS_MARK = "approvals"
