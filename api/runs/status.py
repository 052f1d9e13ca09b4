"""A run's and a conversation's status as the API shows them, derived here and nowhere else.

The worker's ending (worker/run/outcome/ending.py) records each run's status from its thread: a
pending interrupt is ``waiting``, pending tasks are left for a resume. The API adds
only what Redis knows and the database does not yet: a claimed conversation whose
run is not recorded is ``queued``. Every route (lists, details, the chat checks, the
relay's rebuilt ending, the runs listing) asks these functions; whether a run ended, and
how, row or no row, is read by shared/redis/ended.py.
"""

from __future__ import annotations

from api.runs.schemas import RunError
from api.store import ConversationRow
from shared.contracts.runs import RunErrorCode, RunStatus
from shared.storage.rows import RunRow


def run_status(value: str | None) -> RunStatus:
    """A recorded status; one this API does not know (a newer worker's) reads as ``completed``."""
    try:
        return RunStatus(value or RunStatus.COMPLETED)
    except ValueError:
        return RunStatus.COMPLETED


def conversation_status(row: ConversationRow, claim: str | None, claim_row: RunRow | None) -> RunStatus:
    """The conversation's status: its claim's run while one holds it, else its last run's outcome.

    Claimed: queued until the worker records the run (then the row's status).
    """
    if claim is not None:
        return RunStatus(claim_row.status) if claim_row is not None else RunStatus.QUEUED
    return run_status(row.last_status)


def resumable(row: ConversationRow, claim: str | None, status: RunStatus) -> bool:
    """Decided by the checkpoint (pending tasks), never by the last run's status alone:
    a run holds it, or it waits for a decision (a decision is the way on, not a resume)."""
    return row.pending_tasks and claim is None and status not in (RunStatus.RUNNING, RunStatus.WAITING)


def waits_for_decision(row: ConversationRow | None, claim: str | None) -> bool:
    """No run holds the conversation and its last run ended at a pending interrupt.

    Read the claim first, then the row: a run records its outcome before it frees
    the claim, so a row read after a free claim is that run's outcome.
    """
    return claim is None and row is not None and row.last_status == RunStatus.WAITING


def run_error(status: str, code: str | None, message: str | None) -> RunError | None:
    """The error shown for a run that failed or was interrupted (or that carries a code)."""
    if status not in (RunStatus.FAILED, RunStatus.INTERRUPTED) and not code:
        return None
    default = RunErrorCode.INTERRUPTED if status == RunStatus.INTERRUPTED else RunErrorCode.AGENT_FAILURE
    return RunError(code=code or default, message=message or f"the run {status}")
