"""Operations: the agent's model and tools, health, readiness and the Prometheus scrape."""

from __future__ import annotations

from typing import Any

from litestar import Response, get
from litestar.openapi import ResponseSpec
from msgspec import UNSET
from prometheus_client import CONTENT_TYPE_LATEST

from api.auth.guard import OPERATOR_ONLY
from api.http.openapi import errors
from api.ops import metrics, readiness
from api.ops.schemas import AgentInfo, AgentTool, Health, NotReadyBody, Ready
from api.resources import Resources
from shared.redis.liveness import read_liveness


@get(
    "/agent",
    tags=["operations"],
    summary="The model and the tools the agent has",
    description=(
        "From the workers' heartbeat: the newest live worker's model (`OLLAMA_MODEL`) and tools "
        "(`server__tool`, the first line of its description), as of its last beat (every 2 s: a tool "
        "server that starts late adds its tools). With no worker alive, what the last one said "
        "(`workerAlive: false`)."
    ),
    responses=errors(401, 503),
)
async def agent(resources: Resources) -> AgentInfo:
    liveness = await read_liveness(resources.redis)
    beat = liveness.beat
    return AgentInfo(
        model=(beat.model if beat is not None else None) or resources.settings.ollama_model,
        tools=[AgentTool(t.name, t.description) for t in (beat.tools if beat is not None else ())],
        worker_alive=liveness.alive,
    )


@get("/healthz", tags=["operations"], summary="The process is up", opt={"public": True})
async def healthz() -> Health:
    return Health()


@get(
    "/readyz",
    tags=["operations"],
    summary="Redis, the database, a live worker and the model are all there",
    responses={503: ResponseSpec(data_container=NotReadyBody, description="Something is missing")},
)
async def readyz(resources: Resources) -> Ready:
    checks, model = await readiness.check(
        resources.redis, resources.store, resources.http.get(), resources.settings
    )
    worker = await resources.runs.worker() if checks.redis else None
    missing = checks.missing()
    if missing:
        raise readiness.NotReadyError(checks, worker, model)
    return Ready(status="ready", checks=checks, worker=worker if worker is not None else UNSET)


@get(
    "/metrics",
    tags=["operations"],
    summary="Prometheus metrics",
    description="Text exposition format. Queue and worker figures come from Redis, so every API "
    "process agrees; `sophos_sse_subscribers` and `process_*` are this process's own. Operators only.",
    media_type=CONTENT_TYPE_LATEST,
    opt={OPERATOR_ONLY: True},
    responses=errors(401, 403),
)
async def scrape(resources: Resources) -> Response[Any]:
    return Response(await metrics.render(resources), media_type=CONTENT_TYPE_LATEST)
