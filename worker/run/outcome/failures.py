"""What a graph's exception means for its run: the outcome each failure ends it with.

The recursion limit, a drain, a job that cannot continue its thread, the model or the database
out of reach: each has its code and a message that tells the user what to do; anything else is
the agent's failure, logged with its traceback.
"""

from __future__ import annotations

from typing import Any

import structlog
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.errors import GraphDrained, GraphRecursionError

from shared.contracts.runs import RunErrorCode, RunStatus
from shared.settings import Settings
from shared.storage.checkpoints import end_failed_checkpoint_write
from worker.agent.model import is_model_unavailable
from worker.agent.model_check import unavailable_message
from worker.run.inputs import NotResumable
from worker.run.outcome.ending import Outcome
from worker.store import is_database_unavailable

log = structlog.get_logger(__name__)


async def failure_outcome(exc: Exception, settings: Settings, saver: BaseCheckpointSaver[Any]) -> Outcome:
    """The outcome of a run whose graph raised ``exc`` (a checkpoint write it cut is ended on ``saver``)."""
    if isinstance(exc, GraphRecursionError):
        return Outcome(
            RunStatus.FAILED, RunErrorCode.RECURSION_LIMIT,
            f"the agent took more than {settings.agent_recursion_limit} steps",
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
            RunStatus.FAILED, RunErrorCode.MODEL_UNAVAILABLE, unavailable_message(exc, settings),
        )
    if is_database_unavailable(exc):
        log.warning("run.database_unavailable", error=str(exc))
        await end_failed_checkpoint_write(saver)
        return Outcome(
            RunStatus.FAILED, RunErrorCode.DATABASE_UNAVAILABLE,
            f"the database could not be written ({exc}); the steps before are kept, "
            "resume the conversation once it can be written again",
        )
    log.exception("run.agent_failure", exc_info=exc)
    return Outcome(RunStatus.FAILED, RunErrorCode.AGENT_FAILURE, f"{type(exc).__name__}: {exc}")
