"""Sophos's run and conversation statuses as the Agent Server's, derived here and nowhere else
(the runs' table lives in shared/contracts/protocol.py, which the worker's webhooks read too).

docs/agent-protocol.md has the table; tests/test_agent_protocol.py holds it to these functions.
"""

from __future__ import annotations

from typing import Literal

from api.conversations.schemas import ConversationInfo
from shared.contracts.protocol import SDK_RUN_STATUS, sdk_status
from shared.contracts.protocol import SdkRunStatus as SdkRunStatus
from shared.contracts.runs import RunStatus

SdkThreadStatus = Literal["idle", "busy", "interrupted", "error"]

#: the table lives in shared/contracts/protocol.py: the worker's webhook says the same status
_RUN = SDK_RUN_STATUS

RUN_STATUSES: frozenset[str] = frozenset(_RUN.values()) | {"timeout"}
THREAD_STATUSES: frozenset[str] = frozenset({"idle", "busy", "interrupted", "error"})


def run_status(status: RunStatus, error_code: str | None = None) -> SdkRunStatus:
    """The SDK's status of a run (``error_code``: its error's, when it has one)."""
    return sdk_status(status, error_code)


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
