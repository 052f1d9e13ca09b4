"""arq wiring: the functions the worker registers and its start-up and shut-down hooks.

Each function is an entry point made by worker/entry.py (decode, bind the log context, call).
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

from arq import func
from arq.worker import Function

from shared import tracing
from shared.contracts.assistants import ASSISTANT_WRITE_FUNCTION
from shared.contracts.crons import CRON_CREATE_FUNCTION, CRON_DELETE_FUNCTION, CRON_UPDATE_FUNCTION
from shared.contracts.jobs import (
    COPY_FUNCTION,
    DELETE_FUNCTION,
    JOB_FUNCTION,
    PRUNE_FUNCTION,
    RENAME_FUNCTION,
    RunJob,
)
from shared.contracts.runs import RunStatus
from shared.contracts.webhooks import WEBHOOK_FUNCTION
from shared.settings import Settings
from worker.entry import entry_point
from worker.resources import worker_resources
from worker.run.service import RunService
from worker.run.turns import TURN_TRIES, take_turn
from worker.schedule.crons.jobs import cron_create_job, cron_delete_job, cron_update_job
from worker.schedule.webhooks import SPARE_TRIES, WebhookDelivery, deliver_webhook
from worker.upkeep.assistants import assistant_write_job
from worker.upkeep.deletion import delete_job
from worker.upkeep.pruning import prune_job
from worker.upkeep.renaming import rename_job
from worker.upkeep.threadcopy import copy_job


@entry_point(RunJob)
async def execute_run(ctx: dict[str, Any], job: RunJob) -> str:
    """Bind the trace context, take the run's turn (worker/run/turns.py), hand over to the run
    service."""
    service: RunService = ctx["service"]
    # arq's Retry while another run holds the thread
    turn = await take_turn(service.redis, service.store, service.graph, service.ending, job)
    if turn is None:
        return RunStatus.FAILED.value  # refused when its turn came: ended there
    with tracing.run(turn) as span:
        status = await service.execute(turn)
        span.set_attribute("sophos.run.status", status)
        return status


async def on_startup(ctx: dict[str, Any]) -> None:
    settings: Settings = ctx["settings"]
    stack = AsyncExitStack()
    ctx["stack"] = stack
    service = ctx["service"] = await stack.enter_async_context(worker_resources(settings, ctx["redis"]))
    # What the other jobs use: the database, the checkpointer (and ctx["redis"], arq's own).
    ctx["store"], ctx["saver"] = service.store, service.saver
    ctx["webhooks"] = WebhookDelivery(service.settings, service.redis, service.store, service.graph)


async def on_shutdown(ctx: dict[str, Any]) -> None:
    stack: AsyncExitStack | None = ctx.pop("stack", None)
    if stack is not None:
        await stack.aclose()


def functions(settings: Settings) -> list[Function]:
    # A run is never retried by arq behind the user's back: execute_run returns
    # without doing anything for a run that already started (see RunService.execute). Its
    # tries are many only for a run waiting for its turn, deferred once per look (worker/run/turns.py).
    return [
        func(execute_run, name=JOB_FUNCTION, max_tries=TURN_TRIES),
        func(delete_job, name=DELETE_FUNCTION),
        func(rename_job, name=RENAME_FUNCTION),
        func(copy_job, name=COPY_FUNCTION),
        func(prune_job, name=PRUNE_FUNCTION),
        # Retried by arq (Retry with a backoff) up to WEBHOOK_ATTEMPTS; the spare tries let a job
        # started again after a kill record its failure (worker/schedule/webhooks.py).
        func(deliver_webhook, name=WEBHOOK_FUNCTION, max_tries=settings.webhook_attempts + SPARE_TRIES),
        func(cron_create_job, name=CRON_CREATE_FUNCTION),
        func(cron_update_job, name=CRON_UPDATE_FUNCTION),
        func(cron_delete_job, name=CRON_DELETE_FUNCTION),
        func(assistant_write_job, name=ASSISTANT_WRITE_FUNCTION),
    ]
