"""arq entry points: decode the job, bind the log context, call the handler. One decorator.

Every function the worker registers with arq (worker/jobs.py) is a handler of one job struct
(shared/contracts/jobs.py, crons.py, webhooks.py) wrapped by :func:`entry_point`, which takes
arq's ``(ctx, payload)``, decodes the payload with the one codec (a payload that is not that
job fails the job, saying what is wrong, before anything is done), and binds ``run_id``,
``conversation_id`` (those the job has) and ``job_id`` (arq's) to every log line of the job
through structlog's contextvars. The handler gets arq's ``ctx`` (the worker's resources, the
job's try) and the job, and only calls the service that does the work.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import structlog
from arq.typing import WorkerCoroutine

from shared.contracts.codec import decode

J = TypeVar("J")
R = TypeVar("R")

Handler = Callable[[dict[str, Any], J], Awaitable[R]]

#: what of a job is bound to its log lines, when the job has it
_LOG_FIELDS = ("run_id", "conversation_id")


def log_context(job: object, ctx: dict[str, Any]) -> dict[str, Any]:
    """The log context of ``job`` taken by arq (``ctx``): its run and conversation, arq's job id."""
    bound = {name: getattr(job, name) for name in _LOG_FIELDS if hasattr(job, name)}
    return {**bound, "job_id": ctx.get("job_id")}


def entry_point(kind: type[J]) -> Callable[[Handler[J, R]], WorkerCoroutine]:
    """Make ``handler(ctx, job)`` arq's entry point for ``kind`` jobs, called ``(ctx, payload)``."""

    def wrap(handler: Handler[J, R]) -> WorkerCoroutine:
        @functools.wraps(handler)
        async def entry(ctx: dict[str, Any], payload: Any) -> R:
            job = decode(kind, payload)
            with structlog.contextvars.bound_contextvars(**log_context(job, ctx)):
                return await handler(ctx, job)

        # arq's protocol is (ctx, *args, **kwargs); every job of ours is one positional payload.
        return cast(WorkerCoroutine, entry)

    return wrap
