"""Sophos's run and conversation statuses as the Agent Server's, derived here and nowhere else.

docs/agent-protocol.md has the table; tests/test_agent_protocol.py holds it to these functions.
"""

from __future__ import annotations

from typing import Literal

from api.schemas import ConversationInfo
from shared.contracts import RunStatus

SdkRunStatus = Literal["pending", "running", "success", "error", "interrupted", "timeout"]
SdkThreadStatus = Literal["idle", "busy", "interrupted", "error"]

#: ``timeout`` is never given: no Sophos run ends for lack of time (AGENT_RECURSION_LIMIT is an error).
_RUN: dict[RunStatus, SdkRunStatus] = {
    RunStatus.QUEUED: "pending",
    RunStatus.RUNNING: "running",
    RunStatus.COMPLETED: "success",
    RunStatus.FAILED: "error",
    # Stopped before its end by a crash or a drain; the thread keeps what it did and resumes.
    RunStatus.INTERRUPTED: "interrupted",
    # The Agent Server has no `cancelled`: a cancelled run is `interrupted` there.
    RunStatus.CANCELLED: "interrupted",
    # As the Agent Server: a run that pauses for a decision ends `success`; its thread is `interrupted`.
    RunStatus.WAITING: "success",
}

RUN_STATUSES: frozenset[str] = frozenset(_RUN.values()) | {"timeout"}
THREAD_STATUSES: frozenset[str] = frozenset({"idle", "busy", "interrupted", "error"})


def run_status(status: RunStatus) -> SdkRunStatus:
    return _RUN[status]


def thread_status(info: ConversationInfo | None) -> SdkThreadStatus:
    """The thread's status; ``None``: a thread created empty, with no conversation yet.

    ``busy`` while a run is queued or running; ``interrupted`` while it waits for a decision or
    can be resumed (the Agent Server's: the last checkpoint has tasks to run); ``error`` when its
    last run failed and left nothing to resume; ``idle`` otherwise.
    """
    if info is None:
        return "idle"
    status = info.status
    if status in (RunStatus.QUEUED, RunStatus.RUNNING):
        return "busy"
    if status is RunStatus.WAITING:
        return "interrupted"
    if status is RunStatus.FAILED:
        return "error"
    if info.resumable:
        return "interrupted"
    return "idle"
