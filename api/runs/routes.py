"""Runs for operators: the list across conversations, one run, and its cancel."""

from __future__ import annotations

from typing import Annotated

import structlog
from litestar import Response, get, post
from litestar.params import Parameter

from api.http.ids import parse_id
from api.http.openapi import RunId, errors
from api.resources import Resources
from api.runs.cancel import cancel_run
from api.runs.schemas import RunInfo, RunList
from shared.contracts.runs import RunStatus


@get(
    "/runs",
    tags=["runs"],
    summary="Runs across conversations, queued ones included, newest first",
    description=(
        "Queued runs come from the queue itself, with `position` (0: next) and `waitedMs`; running runs "
        "carry `node`, `stepCount` and `elapsedMs`; finished runs `durationMs` and `error`. Page with "
        "`cursor` = the previous page's `nextCursor`. `worker`: is a worker alive, and since when."
    ),
    responses=errors(400, 401, 503),
)
async def list_runs(
    resources: Resources,
    status: Annotated[RunStatus | None, Parameter(description="Only runs with this status")] = None,
    conversation: Annotated[
        str | None, Parameter(description="Only the runs of this conversation (a UUID)")
    ] = None,
    limit: Annotated[int, Parameter(ge=1, le=500, description="Runs per page")] = 50,
    cursor: Annotated[str | None, Parameter(description="`nextCursor` of the previous page")] = None,
) -> RunList:
    conversation_id = parse_id(conversation, "conversation") if conversation is not None else None
    return await resources.runs.page(
        status=status, conversation_id=conversation_id, limit=limit, cursor=cursor
    )


@get("/runs/{run_id:str}", tags=["runs"], summary="One run: status, timings, error, place in queue",
     responses=errors(400, 401, 404, 503))
async def get_run(run_id: RunId, resources: Resources) -> RunInfo:
    run_id = parse_id(run_id, "run id")
    structlog.contextvars.bind_contextvars(run_id=run_id)
    return await resources.runs.get(run_id)


@post(
    "/runs/{run_id:str}/cancel",
    tags=["runs"],
    summary="Cancel a run: a queued one leaves the queue, a running one is stopped at once",
    description=(
        "200 with the run, now `cancelled` (also when it already was: cancelling twice is harmless). "
        "202 with the run, `cancelRequested: true`, when it is running: the worker cuts it at once "
        "(mid-answer or mid-tool), keeps what was streamed marked stopped and records it `cancelled`; "
        "its stream then ends with `end` and status `cancelled`. 409 RUN_FINISHED when it finished "
        "otherwise."
    ),
    status_code=200,
    responses=errors(400, 401, 404, 409, 503),
)
async def cancel(run_id: RunId, resources: Resources) -> Response[RunInfo]:
    run_id = parse_id(run_id, "run id")
    structlog.contextvars.bind_contextvars(run_id=run_id, job_id=run_id)
    result = await cancel_run(resources.runs, run_id)
    return Response(result.run, status_code=200 if result.done else 202)
