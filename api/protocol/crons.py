"""Crons through the Agent Protocol: ``client.crons.create``, ``create_for_thread``, ``search``,
``update``, ``delete`` (docs/agent-protocol.md, "Crons").

The API never writes the database: a cron is stored, changed and deleted by a worker, through a
job (``cron_create``, ``cron_update``, ``cron_delete``: shared/contracts/crons.py,
worker/schedule/crons.py), as a rename is. The
request validates first (a bad schedule, input or parameter is 422 and enqueues nothing), then
waits up to :data:`CRON_WAIT_SECONDS` for the worker's word; without it the job stays queued,
and the cron is stored when a worker takes it. Search and the existence check of an update or a
delete read the database.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
import structlog
from litestar import Controller, Response, delete, patch, post
from litestar.datastructures import State
from litestar.di import Provide
from litestar.params import Parameter
from redis.asyncio import Redis

from api.auth.scope import owner_for_new
from api.conversations.views import Conversations
from api.http.ids import new_id, parse_id
from api.http.openapi import errors
from api.protocol.run_input import assistant_of, message_of
from api.protocol.runs import ASSISTANT_ID
from api.protocol.threads import Threads, thread_id_of
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
from shared.storage.schema import iso_from_timestamp

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
    end_time: str | None = None
    enabled: bool | None = None
    timezone: str | None = None
    stream_mode: str | list[str] | None = None
    stream_subgraphs: bool | None = None
    stream_resumable: bool | None = None
    durability: str | None = None


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
    for name in ("config", "context", "interrupt_before", "interrupt_after", "webhook", "end_time"):
        if getattr(body, name):
            raise _unserved(name)
    strategy = getattr(body, "multitask_strategy", None)
    if strategy not in (None, "reject"):
        raise _unserved(f"multitask_strategy {strategy!r}", "; a tick on a busy thread is skipped (reject)")
    if body.on_run_completed is not None and (on_thread or body.on_run_completed != "keep"):
        raise _unserved(f"on_run_completed {body.on_run_completed!r}", "; each tick's new thread is kept")
    modes = [body.stream_mode] if isinstance(body.stream_mode, str) else body.stream_mode or []
    if any(m != "values" for m in modes):
        raise _unserved("stream_mode other than values")
    if body.durability not in (None, "sync"):
        raise _unserved(f"durability {body.durability!r}", "; every step is checkpointed (sync)")


def cron_shape(row: CronRow) -> dict[str, Any]:
    """The SDK's ``Cron``, with what its ticks did (``fired``, ``skipped``, ``last_tick``)."""
    metadata = json.loads(row.metadata)
    schedule = Schedule.parse(row.schedule)
    last = None
    if row.last_tick is not None:
        last = {"tick": iso(row.last_tick), "outcome": row.last_outcome, "run_id": row.last_run_id}
    return {
        "cron_id": row.id, "assistant_id": ASSISTANT_ID, "thread_id": row.thread_id,
        "on_run_completed": None if row.thread_id else "keep", "end_time": None,
        "schedule": schedule.expression, "timezone": schedule.zone,
        "created_at": row.created_at, "updated_at": row.updated_at,
        "payload": {
            "assistant_id": ASSISTANT_ID, "input": {"messages": [{"role": "user", "content": row.message}]},
            "metadata": metadata,
        },
        "user_id": None, "next_run_date": iso(row.next_tick) if row.enabled else None, "metadata": metadata,
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
        message = message_of(body.input)
        if message is None:
            raise BadRequest(
                "a cron's input must be one user message: {\"messages\": [{\"role\": \"user\", ...}]}"
            )
        # A cron on a thread is its owner's (an operator may make one on a user's thread).
        owner = (await self.threads.find(thread_id)).owner if thread_id is not None else owner_for_new()
        now = time.time()
        cron_id = new_id()
        job = CronCreate(
            cron_id, thread_id, schedule.text, message, body.metadata or {}, now, f"cron:create:{cron_id}",
            owner, body.enabled is not False,
        )
        await submit_cron_job(self.redis, CRON_CREATE_FUNCTION, job)
        log.info("cron.create_accepted", cron_id=cron_id, thread_id=thread_id, schedule=schedule.text)
        await self._done(job.job_id, f"create cron {cron_id}")
        stored = await self.store.crons(cron_id=cron_id)
        if stored:
            return cron_shape(stored[0])
        # Not taken by a worker yet: what it will store.
        created = iso_from_timestamp(now)
        return cron_shape(CronRow(
            cron_id, thread_id, schedule.text, message, json.dumps(body.metadata or {}), created, created,
            schedule.next_after(now), 0, 0, None, None, None, owner, job.enabled,
        ))

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
        message = None
        if body.input is not None:
            message = message_of(body.input)
            if message is None:
                raise BadRequest(
                    "a cron's input must be one user message: {\"messages\": [{\"role\": \"user\", ...}]}"
                )
        now = time.time()
        job = CronUpdate(cron_id, f"cron:update:{cron_id}:{new_id()}", now, schedule, message, body.metadata,
                         body.enabled)
        await submit_cron_job(self.redis, CRON_UPDATE_FUNCTION, job)
        log.info("cron.update_accepted", cron_id=cron_id, schedule=schedule, enabled=body.enabled)
        if await self._done(job.job_id, f"update cron {cron_id}"):
            stored = await self.store.crons(cron_id=cron_id)
            if stored:
                return cron_shape(stored[0])
        # Not taken by a worker yet: what it will store.
        enabled = cron.enabled if body.enabled is None else body.enabled
        restart = schedule is not None or (enabled and not cron.enabled)
        return cron_shape(CronRow(
            cron.id, cron.thread_id, schedule or cron.schedule, message or cron.message,
            cron.metadata if body.metadata is None else json.dumps(body.metadata), cron.created_at,
            iso_from_timestamp(now),
            Schedule.parse(schedule or cron.schedule).next_after(now) if restart else cron.next_tick,
            cron.fired, cron.skipped, cron.last_tick, cron.last_outcome, cron.last_run_id, cron.owner,
            enabled,
        ))

    async def delete(self, cron_id: str) -> bool:
        """Delete the cron (NotFound if there is none); True once the worker has."""
        cron_id = parse_id(cron_id, "cron_id")
        if not await self.store.crons(cron_id=cron_id):
            raise NotFound(f"cron {cron_id} not found")
        job = CronDelete(cron_id, f"cron:delete:{cron_id}:{new_id()}")
        await submit_cron_job(self.redis, CRON_DELETE_FUNCTION, job)
        return await self._done(job.job_id, f"delete cron {cron_id}")

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
        key = cron_done_key(job_id)
        reply = await self.redis.blpop([key], timeout=self.wait_seconds)  # type: ignore[misc, arg-type]
        if reply is None:
            return False
        if str(reply[1]) != "done":
            raise DatabaseUnavailable(f"the worker could not {what} ({reply[1]}); try again")
        return True


def _crons(state: State) -> Crons:
    resources: Resources = state.resources
    threads = Threads(resources.store, resources.redis, Conversations(resources.store, resources.redis))
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
