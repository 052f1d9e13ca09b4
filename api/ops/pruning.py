"""``POST /api/checkpoints/prune`` (operators): prune the checkpoints no conversation needs any more;
``GET /api/checkpoints/prune/{job}``: how far it got.

The API never writes the database: it enqueues the worker's prune job (worker/upkeep/pruning.py),
which walks every conversation a batch per job, and records its progress in Redis. What is kept
and what goes: shared/storage/threads/pruning.py, and docs/operating.md "Pruning checkpoints".
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import msgspec
from litestar import Response, get, post
from litestar.params import Parameter
from msgspec import UNSET, UnsetType

from api.auth.guard import OPERATOR_ONLY
from api.http.ids import new_id
from api.http.openapi import errors
from api.resources import Resources
from shared.contracts.jobs import PruneJob
from shared.errors import NotFound
from shared.redis.keys import PRUNE_PROGRESS_TTL_SECONDS, prune_key
from shared.redis.queue import submit_prune


class PruneProgress(msgspec.Struct, rename="camel"):
    """A prune's progress: ``running`` until its last batch, then ``done`` (or ``failed: …``)."""

    job: str
    state: str
    #: conversations looked at so far, and of those, skipped for a run queued, running or waiting
    conversations: int = 0
    skipped: int = 0
    #: checkpoints deleted, and kept, in the conversations pruned so far
    deleted: int = 0
    kept: int = 0
    batches: int = 0
    started_at: float | UnsetType = UNSET
    finished_at: float | UnsetType = UNSET


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def progress_of(job_id: str, fields: dict[Any, Any]) -> PruneProgress:
    got = {_text(k): _text(v) for k, v in fields.items()}
    return PruneProgress(
        job=job_id, state=got.get("state", "running"),
        conversations=int(got.get("conversations", 0)), skipped=int(got.get("skipped", 0)),
        deleted=int(got.get("deleted", 0)), kept=int(got.get("kept", 0)), batches=int(got.get("batches", 0)),
        started_at=float(got["started_at"]) if "started_at" in got else UNSET,
        finished_at=float(got["finished_at"]) if "finished_at" in got else UNSET,
    )


@post(
    "/checkpoints/prune",
    tags=["operations"],
    summary="Prune the checkpoints no conversation needs any more (operators)",
    description=(
        "Enqueues the worker's prune: every conversation, a batch at a time, keeps each branch's latest "
        "checkpoint and what its state and its branches are read from; the older steps go "
        "(docs/operating.md, \"Pruning checkpoints\"). Answers at once with the job, whose progress "
        "`GET /api/checkpoints/prune/{job}` reads. Operators only."
    ),
    status_code=202,
    opt={OPERATOR_ONLY: True},
    responses=errors(401, 403, 503),
)
async def prune_checkpoints(resources: Resources) -> Response[PruneProgress]:
    now = time.time()
    job = PruneJob(f"prune:{new_id()}", now)
    key = prune_key(job.job_id)
    # The progress first, so a read right after the answer finds the job.
    await resources.redis.hset(key, mapping={"state": "running", "started_at": now})  # type: ignore[misc]
    await resources.redis.expire(key, PRUNE_PROGRESS_TTL_SECONDS)
    await submit_prune(resources.redis, job)
    return Response(PruneProgress(job=job.job_id, state="running", started_at=now), status_code=202)


@get(
    "/checkpoints/prune/{job:str}",
    tags=["operations"],
    summary="How far a prune got (operators)",
    opt={OPERATOR_ONLY: True},
    responses=errors(401, 403, 404, 503),
)
async def prune_progress(
    job: Annotated[str, Parameter(description="The prune's job, as its POST answered")], resources: Resources,
) -> PruneProgress:
    fields = await resources.redis.hgetall(prune_key(job))  # type: ignore[misc]
    if not fields:
        raise NotFound(f"no prune {job} (unknown, or finished over a day ago)")
    return progress_of(job, fields)
