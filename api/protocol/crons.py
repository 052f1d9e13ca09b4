"""Crons through the Agent Protocol: ``client.crons.create``, ``create_for_thread``, ``search``,
``update``, ``delete`` (docs/agent-protocol.md, "Crons").

The API never writes the database: a cron is stored, changed and deleted by a worker, through a
job (``cron_create``, ``cron_update``, ``cron_delete``: shared/contracts/crons.py,
worker/schedule/crons/), as a rename is. The
request validates first (a bad schedule, input or parameter is 422 and enqueues nothing), then
waits up to :data:`CRON_WAIT_SECONDS` for the worker's word; without it the job stays queued,
and the cron is stored when a worker takes it. Search and the existence check of an update or a
delete read the database.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

import msgspec
import structlog
from litestar import Controller, Response, delete, patch, post
from litestar.datastructures import State
from litestar.di import Provide
from litestar.params import Parameter
from redis.asyncio import Redis

from api.auth.scope import owner_for_new
from api.http.ids import new_id, parse_id
from api.http.openapi import errors
from api.protocol.runs.input import assistant_of, message_of
from api.protocol.runs.service import ASSISTANT_ID
from api.protocol.threads.bodies import thread_id_of
from api.protocol.threads.service import Threads
from api.resources import Resources
from api.store import Store
from shared.contracts.crons import (
    CRON_CREATE_FUNCTION,
    CRON_DELETE_FUNCTION,
    CRON_UPDATE_FUNCTION,
    CronCreate,
    CronDelete,
    CronRow,
    CronUpdate,
    Schedule,
    cron_done_key,
    iso,
    submit_cron_job,
)
from shared.errors import BadRequest, DatabaseUnavailable, NotFound
from shared.redis.outcomes import awaited

log = structlog.get_logger(__name__)

#: How long a create or delete waits for the worker before answering (the job stays queued).
CRON_WAIT_SECONDS = 3.0
SEARCH_MAX = 1000
#: search's ``sort_by``: the column each sorts on
SORTS = {
    "cron_id": "id", "thread_id": "thread_id", "created_at": "created_at", "updated_at": "updated_at",
    "next_run_date": "next_tick",
}


class CronBody(msgspec.Struct):
    """Body of ``POST /runs/crons`` and ``POST /threads/{id}/runs/crons``: every field the SDK sends."""

    assistant_id: str
    schedule: Any = None
    input: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    context: dict[str, Any] | None = None
    checkpoint_during: bool | None = None
    interrupt_before: str | list[str] | None = None
    interrupt_after: str | list[str] | None = None
    webhook: str | None = None
    on_run_completed: str | None = None
    multitask_strategy: str | None = None
    end_time: str | None = None
    enabled: bool | None = None
    timezone: str | None = None
    stream_mode: str | list[str] | None = None
    stream_subgraphs: bool | None = None
    stream_resumable: bool | None = None
    durability: str | None = None


class CronPatch(msgspec.Struct):
    """Body of ``PATCH /runs/crons/{id}`` (``client.crons.update``): every field the SDK sends."""

    schedule: Any = None
    input: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    context: dict[str, Any] | None = None
    interrupt_before: str | list[str] | None = None
    interrupt_after: str | list[str] | None = None
    webhook: str | None = None
    on_run_completed: str | None = None
    #: left out: kept; null: removed (the SDK sends null for ``end_time=None``)
    end_time: str | msgspec.UnsetType | None = msgspec.UNSET
    enabled: bool | None = None
    timezone: str | None = None
    stream_mode: str | list[str] | None = None
    stream_subgraphs: bool | None = None
    stream_resumable: bool | None = None
    durability: str | None = None


class CronCount(msgspec.Struct):
    """Body of ``POST /runs/crons/count``."""

    assistant_id: str | None = None
    thread_id: str | None = None
    metadata: dict[str, Any] | None = None


class CronSearch(msgspec.Struct):
    assistant_id: str | None = None
    thread_id: str | None = None
    enabled: bool | None = None
    limit: int = 10
    offset: int = 0
    metadata: dict[str, Any] | None = None
    sort_by: str | None = None
    sort_order: str | None = None
    select: list[str] | None = None


def _unserved(name: str, detail: str = "") -> BadRequest:
    return BadRequest(f"{name} is not served by Sophos's crons{detail} (docs/agent-protocol.md)")


def refuse_unserved(body: CronBody | CronPatch, *, on_thread: bool) -> None:
    """Refuse what a cron of Sophos does not do, naming it, rather than ignore it."""
    for name in ("config", "context", "interrupt_before", "interrupt_after", "webhook"):
        if getattr(body, name):
            raise _unserved(name)
    strategy = getattr(body, "multitask_strategy", None)
    if strategy not in (None, "reject"):
        raise _unserved(f"multitask_strategy {strategy!r}", "; a tick on a busy thread is skipped (reject)")
    if body.on_run_completed is not None and on_thread:
        raise _unserved("on_run_completed on a cron with a thread", "; its ticks run on that thread")
    if body.on_run_completed not in (None, "delete", "keep"):
        given = str(body.on_run_completed)[:32]
        raise BadRequest(f"on_run_completed must be 'delete' or 'keep', not {given!r}")
    modes = [body.stream_mode] if isinstance(body.stream_mode, str) else body.stream_mode or []
    if any(m != "values" for m in modes):
        raise _unserved("stream_mode other than values")
    if body.durability not in (None, "sync"):
        raise _unserved(f"durability {body.durability!r}", "; every step is checkpointed (sync)")


def cron_message(value: dict[str, Any] | None) -> str:
    """A cron's input: one user message (its text), or 422."""
    message = message_of(value)
    if message is None:
        raise BadRequest(
            "a cron's input must be one user message: {\"messages\": [{\"role\": \"user\", ...}]}"
        )
    return message


def end_time_of(value: str) -> int:
    """``end_time`` (an ISO 8601 time; without a zone, UTC) in seconds since the epoch, or 422."""
    try:
        moment = datetime.fromisoformat(value)
    except (TypeError, ValueError):
        raise BadRequest(f"end_time must be an ISO 8601 date and time, got {str(value)[:40]!r}") from None
    return int((moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp())


def cron_shape(row: CronRow) -> dict[str, Any]:
    """The SDK's ``Cron``, with what its ticks did (``fired``, ``skipped``, ``last_tick``)."""
    metadata = json.loads(row.metadata)
    schedule = Schedule.parse(row.schedule)
    last = None
    if row.last_tick is not None:
        last = {"tick": iso(row.last_tick), "outcome": row.last_outcome, "run_id": row.last_run_id}
    return {
        "cron_id": row.id, "assistant_id": ASSISTANT_ID, "thread_id": row.thread_id,
        "on_run_completed": None if row.thread_id else "delete" if row.delete_threads else "keep",
        "end_time": iso(row.end_time) if row.end_time is not None else None,
        "schedule": schedule.expression, "timezone": schedule.zone,
        "created_at": row.created_at, "updated_at": row.updated_at,
        "payload": {
            "assistant_id": ASSISTANT_ID, "input": {"messages": [{"role": "user", "content": row.message}]},
            "metadata": metadata,
        },
        "user_id": None, "next_run_date": iso(row.next_run) if row.next_run is not None else None,
        "metadata": metadata,
        "enabled": row.enabled,
        "fired": row.fired, "skipped": row.skipped, "last_tick": last,
    }


@dataclass(frozen=True, slots=True)
class Crons:
    store: Store
    redis: Redis
    threads: Threads
    wait_seconds: float = CRON_WAIT_SECONDS

    async def create(self, thread_id: str | None, body: CronBody) -> dict[str, Any]:
        assistant_of(body.assistant_id)
        schedule = Schedule.parse(body.schedule, body.timezone)
        refuse_unserved(body, on_thread=thread_id is not None)
        message = cron_message(body.input)
        end_time = end_time_of(body.end_time) if body.end_time is not None else None
        # A cron on a thread is its owner's (an operator may make one on a user's thread).
        owner = (await self.threads.find(thread_id)).owner if thread_id is not None else owner_for_new()
        now = time.time()
        cron_id = new_id()
        job = CronCreate(
            cron_id, thread_id, schedule.text, message, body.metadata or {}, now, f"cron:create:{cron_id}",
            owner, body.enabled is not False, end_time,
            # The Agent Server's default: each tick's new thread deleted once its run has ended.
            delete_threads=thread_id is None and body.on_run_completed != "keep",
        )
        await submit_cron_job(self.redis, CRON_CREATE_FUNCTION, job)
        log.info("cron.create_accepted", cron_id=cron_id, thread_id=thread_id, schedule=schedule.text)
        await self._done(job.job_id, f"create cron {cron_id}")
        stored = await self.store.crons(cron_id=cron_id)
        # Not taken by a worker yet: what it will store.
        return cron_shape(stored[0] if stored else CronRow.created(job))

    async def update(self, cron_id: str, body: CronPatch) -> dict[str, Any]:
        """Change the cron's schedule, ``enabled`` or run payload (NotFound if there is none); the
        cron as the worker stored it, or, before a worker takes the job, as it will."""
        cron_id = parse_id(cron_id, "cron_id")
        found = await self.store.crons(cron_id=cron_id)
        if not found:
            raise NotFound(f"cron {cron_id} not found")
        cron = found[0]
        refuse_unserved(body, on_thread=cron.thread_id is not None)
        schedule = None
        if body.schedule is not None or body.timezone is not None:
            current = Schedule.parse(cron.schedule)
            expression = current.expression if body.schedule is None else body.schedule
            zone = current.zone if body.timezone is None and body.schedule is None else body.timezone
            schedule = Schedule.parse(expression, zone).text
        message = cron_message(body.input) if body.input is not None else None
        end_time = body.end_time if isinstance(body.end_time, str) else None
        job = CronUpdate(
            cron_id, f"cron:update:{cron_id}:{new_id()}", time.time(), schedule, message, body.metadata,
            body.enabled, end_time_of(end_time) if end_time is not None else None,
            clear_end_time=body.end_time is None,
            delete_threads=None if body.on_run_completed is None else body.on_run_completed == "delete",
        )
        await submit_cron_job(self.redis, CRON_UPDATE_FUNCTION, job)
        log.info("cron.update_accepted", cron_id=cron_id, schedule=schedule, enabled=body.enabled)
        if await self._done(job.job_id, f"update cron {cron_id}"):
            stored = await self.store.crons(cron_id=cron_id)
            if stored:
                return cron_shape(stored[0])
        # Not taken by a worker yet: what it will store.
        return cron_shape(cron.updated(job))

    async def delete(self, cron_id: str) -> bool:
        """Delete the cron (NotFound if there is none); True once the worker has."""
        cron_id = parse_id(cron_id, "cron_id")
        if not await self.store.crons(cron_id=cron_id):
            raise NotFound(f"cron {cron_id} not found")
        job = CronDelete(cron_id, f"cron:delete:{cron_id}:{new_id()}")
        await submit_cron_job(self.redis, CRON_DELETE_FUNCTION, job)
        return await self._done(job.job_id, f"delete cron {cron_id}")

    async def count(self, body: CronCount) -> int:
        """How many crons match ``assistant_id``, ``thread_id`` and ``metadata``, as a search
        filters them (up to :data:`SEARCH_MAX`)."""
        search = CronSearch(
            assistant_id=body.assistant_id, thread_id=body.thread_id, metadata=body.metadata, limit=SEARCH_MAX
        )
        return len(await self.search(search))

    async def search(self, body: CronSearch) -> list[dict[str, Any]]:
        if body.select:
            raise BadRequest("select is not served by Sophos: a cron comes whole")
        if not 1 <= body.limit <= SEARCH_MAX or body.offset < 0:
            raise BadRequest(f"limit must be 1 to {SEARCH_MAX} and offset at least 0")
        if body.sort_by is not None and body.sort_by not in SORTS:
            raise BadRequest(f"sort_by must be one of {', '.join(SORTS)}")
        if body.sort_order not in (None, "asc", "desc"):
            raise BadRequest("sort_order must be asc or desc")
        if body.assistant_id is not None:
            try:
                assistant_of(body.assistant_id)
            except NotFound:
                return []
        thread_id = thread_id_of(body.thread_id) if body.thread_id is not None else None
        order = f"{SORTS[body.sort_by or 'created_at']} {(body.sort_order or 'desc').upper()}"
        if body.metadata:
            rows = await self.store.crons(
                thread_id=thread_id, enabled=body.enabled, order=order, limit=SEARCH_MAX, offset=0
            )
            shaped = [cron_shape(r) for r in rows]
            wanted = body.metadata.items()
            matching = [c for c in shaped if all(c["metadata"].get(k) == v for k, v in wanted)]
            return matching[body.offset : body.offset + body.limit]
        rows = await self.store.crons(
            thread_id=thread_id, enabled=body.enabled, order=order, limit=body.limit, offset=body.offset
        )
        return [cron_shape(r) for r in rows]

    async def _done(self, job_id: str, what: str) -> bool:
        outcome = await awaited(self.redis, cron_done_key(job_id), self.wait_seconds)
        if outcome is None:
            return False
        if outcome != "done":
            raise DatabaseUnavailable(f"the worker could not {what} ({outcome}); try again")
        return True


def _crons(state: State) -> Crons:
    resources: Resources = state.resources
    threads = Threads.of(resources)
    return Crons(resources.store, resources.redis, threads)


CronId = Annotated[str, Parameter(description="The cron's id (a UUID)")]
TAGS = ["agent protocol"]
DEPENDENCIES = {"crons": Provide(_crons, sync_to_thread=False)}
ThreadId = Annotated[str, Parameter(description="The thread's id (a UUID): its conversation's id")]


class CronsController(Controller):
    tags = TAGS
    dependencies = DEPENDENCIES

    @post("/runs/crons", status_code=200, summary="A cron: a run on a new thread at each tick of a schedule",
          responses=errors(401, 404, 422, 503))
    async def create(self, data: CronBody, crons: Crons) -> dict[str, Any]:
        return await crons.create(None, data)

    @post("/threads/{thread_id:str}/runs/crons", status_code=200,
          summary="A cron on a thread: a run on it at each tick of a schedule (skipped while it is busy)",
          responses=errors(401, 404, 422, 503))
    async def create_for_thread(self, thread_id: ThreadId, data: CronBody, crons: Crons) -> dict[str, Any]:
        return await crons.create(thread_id_of(thread_id), data)

    @post("/runs/crons/search", status_code=200, summary="Crons, newest first, with what their ticks did",
          responses=errors(401, 422))
    async def search(self, data: CronSearch, crons: Crons) -> list[dict[str, Any]]:
        return await crons.search(data)

    @post("/runs/crons/count", status_code=200, summary="How many crons match (thread, metadata)",
          responses=errors(401, 422))
    async def count(self, data: CronCount, crons: Crons) -> int:
        return await crons.count(data)

    @patch("/runs/crons/{cron_id:str}", status_code=200,
           summary="Change a cron: its schedule, whether it is enabled, its run's input and metadata",
           responses=errors(401, 404, 422, 503))
    async def update(self, cron_id: CronId, data: CronPatch, crons: Crons) -> dict[str, Any]:
        return await crons.update(cron_id, data)

    @delete("/runs/crons/{cron_id:str}", status_code=204,
            summary="Delete a cron: none of its ticks fires after",
            responses=errors(401, 404, 422, 503))
    async def delete_cron(self, cron_id: CronId, crons: Crons) -> Response[None]:
        done = await crons.delete(cron_id)
        return Response(None, status_code=204 if done else 202)
