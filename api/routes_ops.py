"""Operators' routes: cancel a run (under /api) and the Prometheus scrape (``/metrics``)."""

from __future__ import annotations

from typing import Any

import structlog
from litestar import Response, get, post
from prometheus_client import CONTENT_TYPE_LATEST

from api import metrics
from api.cancel import cancel_run
from api.ids import parse_id
from api.openapi import RunId, errors
from api.resources import Resources
from api.schemas import RunInfo


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


@get(
    "/metrics",
    tags=["operations"],
    summary="Prometheus metrics",
    description="Text exposition format. Queue and worker figures come from Redis, so every API "
    "process agrees; `sophos_sse_subscribers` and `process_*` are this process's own.",
    media_type=CONTENT_TYPE_LATEST,
)
async def scrape(resources: Resources) -> Response[Any]:
    return Response(await metrics.render(resources), media_type=CONTENT_TYPE_LATEST)
