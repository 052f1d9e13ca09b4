"""Assistants through the Agent Protocol: configurations of the one agent (docs/agent-protocol.md,
"Assistants"; what they say: shared/contracts/assistants.py).

``agent`` (or its fixed UUID) is the default: config/'s agent, everyone's to read, never stored,
changed or deleted (409 ``DEFAULT_ASSISTANT``). Every other assistant is its creator's, as a
thread is: another user's is absent (404) on every route and in every search and count (the
store's reads filter by the caller: api/auth/scope.py). The API never writes the database: a
create, update, version change or delete is an ``assistant_write`` job a worker runs
(worker/upkeep/assistants.py); the request checks everything first (a bad body is 422 and
enqueues nothing), then waits up to :data:`WRITE_WAIT_SECONDS` for the worker's word and answers
with what is stored (no word in time: 503, and the job stays queued).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import msgspec
import structlog
from redis.asyncio import Redis

from api.auth.scope import owner_for_new
from api.http.ids import new_id, parse_id
from api.store import Store
from shared.contracts.assistants import (
    ASSISTANT_WRITE_FUNCTION,
    AgentConfig,
    AssistantRow,
    AssistantWrite,
    assistant_done_key,
    resolve,
    settings_of,
)
from shared.contracts.protocol import ASSISTANT_ID, GRAPH_ID
from shared.errors import AssistantExists, BadRequest, DatabaseUnavailable, DefaultAssistant, NotFound
from shared.redis.outcomes import awaited
from shared.redis.queue import submit_job

log = structlog.get_logger(__name__)

#: How long a write waits for the worker before answering 503 (the job stays queued).
WRITE_WAIT_SECONDS = 5.0
#: the most assistants a search reads (each user's own, and the default)
SEARCH_MAX = 1000
SORTS = ("assistant_id", "graph_id", "name", "created_at", "updated_at")
#: what the protocol says of the default assistant's creation: it has always been there
DEFAULT_CREATED_AT = "1970-01-01T00:00:00+00:00"
UNNAMED = "Untitled"


class AssistantCreate(msgspec.Struct):
    """Body of ``POST /assistants``: every field the SDK sends."""

    graph_id: str | None = None
    assistant_id: str | None = None
    config: dict[str, Any] | None = None
    context: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    if_exists: str | None = None
    name: str | None = None
    description: str | None = None


class AssistantUpdate(msgspec.Struct):
    """Body of ``PATCH /assistants/{id}``: the fields given replace the latest version's
    (``metadata`` is merged into it)."""

    graph_id: str | None = None
    config: dict[str, Any] | None = None
    context: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    name: str | None = None
    description: str | None = None


class AssistantSearch(msgspec.Struct):
    metadata: dict[str, Any] | None = None
    graph_id: str | None = None
    name: str | None = None
    limit: int = 10
    offset: int = 0
    sort_by: str | None = None
    sort_order: str | None = None
    select: list[str] | None = None


class AssistantCount(msgspec.Struct):
    metadata: dict[str, Any] | None = None
    graph_id: str | None = None
    name: str | None = None


class VersionSearch(msgspec.Struct):
    metadata: dict[str, Any] | None = None
    limit: int = 10
    offset: int = 0


class SetLatest(msgspec.Struct):
    version: int


def is_default(assistant_id: str) -> bool:
    return assistant_id in (GRAPH_ID, ASSISTANT_ID)


def default_shape() -> dict[str, Any]:
    """The SDK's ``Assistant``: config/'s agent."""
    return {
        "assistant_id": ASSISTANT_ID, "graph_id": GRAPH_ID, "name": GRAPH_ID,
        "description": "Sophos's durable chat agent: a model and its MCP tools, every step checkpointed",
        "config": {}, "context": {}, "metadata": {"created_by": "system"}, "version": 1,
        "created_at": DEFAULT_CREATED_AT, "updated_at": DEFAULT_CREATED_AT,
    }


def shape(row: AssistantRow, *, as_version: bool = False) -> dict[str, Any]:
    """The SDK's ``Assistant`` (or, ``as_version``, its ``AssistantVersion``)."""
    return {
        "assistant_id": row.id, "graph_id": row.graph_id, "name": row.name, "description": row.description,
        "config": row.config, "context": row.context, "metadata": row.metadata, "version": row.version,
        "created_at": row.version_created_at if as_version else row.created_at,
        "updated_at": row.version_created_at if as_version else row.updated_at,
    }


def _graph_of(graph_id: str | None) -> str:
    if graph_id not in (None, GRAPH_ID):
        raise BadRequest(f"graph_id {graph_id[:64]!r} is not served: Sophos has one graph, {GRAPH_ID!r}")
    return GRAPH_ID


def _matches(one: dict[str, Any], metadata: dict[str, Any] | None, graph_id: str | None,
             name: str | None) -> bool:
    return (
        graph_id in (None, one["graph_id"])
        and (not name or name.lower() in str(one["name"]).lower())
        and all(one["metadata"].get(k) == v for k, v in (metadata or {}).items())
    )


@dataclass(frozen=True, slots=True)
class Assistants:
    store: Store
    redis: Redis
    wait_seconds: float = WRITE_WAIT_SECONDS

    async def row(self, assistant_id: str) -> AssistantRow:
        """The caller's stored assistant at its latest version; NotFound otherwise (the default
        is not stored: ask :func:`is_default` first)."""
        try:
            rows = await self.store.assistants(assistant_id=parse_id(assistant_id, "assistant_id"))
        except BadRequest:  # not a UUID: a graph's name, as the Agent Server takes it; one it has not
            rows = []
        if not rows:
            raise NotFound(f"assistant {assistant_id[:64]!r} not found (the default is {GRAPH_ID!r})")
        return rows[0]

    async def get(self, assistant_id: str) -> dict[str, Any]:
        return default_shape() if is_default(assistant_id) else shape(await self.row(assistant_id))

    async def create(self, body: AssistantCreate) -> dict[str, Any]:
        graph_id = _graph_of(body.graph_id)
        settings_of(body.config, body.context, where="the assistant")
        if body.if_exists not in (None, "raise", "do_nothing"):
            raise BadRequest("if_exists must be 'raise' or 'do_nothing'")
        if body.assistant_id is not None and is_default(body.assistant_id):
            raise DefaultAssistant(f"{GRAPH_ID!r} is the default assistant, made from config/: it exists")
        assistant_id = parse_id(body.assistant_id, "assistant_id") if body.assistant_id else new_id()
        existing = await self.store.assistants(assistant_id=assistant_id)
        if existing:
            if body.if_exists == "do_nothing":
                return shape(existing[0])
            raise AssistantExists(
                f"assistant {assistant_id} exists (if_exists: do_nothing takes it as it is)"
            )
        await self._write(AssistantWrite(
            "create", assistant_id, f"assistant:create:{new_id()}", _now(), owner_for_new(), graph_id,
            body.name or UNNAMED, body.description, body.config or {}, body.context or {},
            body.metadata or {},
        ), f"create assistant {assistant_id}")
        # Not there: another user's id (the worker left theirs as it was), absent to this one.
        return shape(await self.row(assistant_id))

    async def update(self, assistant_id: str, body: AssistantUpdate) -> dict[str, Any]:
        if is_default(assistant_id):
            raise DefaultAssistant(f"{GRAPH_ID!r}, the default assistant, is config/'s: create another")
        row = await self.row(assistant_id)
        _graph_of(body.graph_id)
        settings_of(
            body.config if body.config is not None else row.config,
            body.context if body.context is not None else row.context, where="the assistant",
        )
        await self._write(AssistantWrite(
            "update", row.id, f"assistant:update:{new_id()}", _now(), row.owner, body.graph_id, body.name,
            body.description, body.config, body.context, body.metadata,
        ), f"update assistant {row.id}")
        return shape(await self.row(row.id))

    async def versions(self, assistant_id: str, body: VersionSearch) -> list[dict[str, Any]]:
        _page(body.limit, body.offset)
        if is_default(assistant_id):
            every = [default_shape()]
        else:
            row = await self.row(assistant_id)
            rows = await self.store.assistants(assistant_id=row.id, versions=True, limit=SEARCH_MAX)
            every = [shape(r, as_version=True) for r in rows]
        matching = [v for v in every if _matches(v, body.metadata, None, None)]
        return matching[body.offset : body.offset + body.limit]

    async def set_latest(self, assistant_id: str, version: int) -> dict[str, Any]:
        if is_default(assistant_id):
            if version != 1:
                raise NotFound(f"the default assistant has one version, 1; not {version}")
            return default_shape()
        row = await self.row(assistant_id)
        if version not in {r.version for r in await self.store.assistants(
                assistant_id=row.id, versions=True, limit=SEARCH_MAX)}:
            raise NotFound(f"assistant {row.id} has no version {version}")
        await self._write(AssistantWrite(
            "latest", row.id, f"assistant:latest:{new_id()}", _now(), row.owner, version=version,
        ), f"set assistant {row.id}'s latest version")
        return shape(await self.row(row.id))

    async def delete(self, assistant_id: str, *, delete_threads: bool) -> None:
        if is_default(assistant_id):
            raise DefaultAssistant(f"{GRAPH_ID!r}, the default assistant, cannot be deleted")
        row = await self.row(assistant_id)
        if delete_threads:
            raise BadRequest(
                "delete_threads is not served by Sophos: delete the threads (docs/agent-protocol.md)"
            )
        await self._write(AssistantWrite(
            "delete", row.id, f"assistant:delete:{new_id()}", _now(), row.owner,
        ), f"delete assistant {row.id}")

    async def matching(self, metadata: dict[str, Any] | None, graph_id: str | None,
                       name: str | None) -> list[dict[str, Any]]:
        """Every assistant the caller sees that matches (the default among them), newest first."""
        shaped = [shape(r) for r in await self.store.assistants(limit=SEARCH_MAX)] + [default_shape()]
        return [a for a in shaped if _matches(a, metadata, graph_id, name)]

    async def search(self, body: AssistantSearch) -> tuple[list[dict[str, Any]], int | None]:
        """A page of the matching assistants, and the offset of the next page (None: the last)."""
        _page(body.limit, body.offset)
        if body.select:
            raise BadRequest("select is not served by Sophos: an assistant comes whole")
        if body.sort_by is not None and body.sort_by not in SORTS:
            raise BadRequest(f"sort_by must be one of {', '.join(SORTS)}")
        if body.sort_order not in (None, "asc", "desc"):
            raise BadRequest("sort_order must be asc or desc")
        found = await self.matching(body.metadata, body.graph_id, body.name)
        if body.sort_by is not None:
            key = body.sort_by
            found.sort(key=lambda a: (str(a[key]), a["assistant_id"]), reverse=body.sort_order != "asc")
        elif body.sort_order == "asc":
            found.reverse()
        end = body.offset + body.limit
        return found[body.offset : end], end if end < len(found) else None

    async def _write(self, job: AssistantWrite, what: str) -> None:
        await submit_job(self.redis, ASSISTANT_WRITE_FUNCTION, job.job_id, job, time.time())
        outcome = await awaited(self.redis, assistant_done_key(job.job_id), self.wait_seconds)
        if outcome is None:
            raise DatabaseUnavailable(
                f"no worker could {what} within {self.wait_seconds:g} s: it will once a worker takes the job"
            )
        if outcome == "missing":
            raise NotFound(f"could not {what}: it is gone")
        if outcome != "done":
            raise DatabaseUnavailable(f"the worker could not {what} ({outcome}); try again")
        log.info("assistant.written", op=job.op, assistant_id=job.assistant_id)

    async def agent_for_run(
        self, assistant_id: str, config: dict[str, Any] | None, context: dict[str, Any] | None
    ) -> AgentConfig:
        """The agent a run of ``assistant_id`` runs: its latest version, with the run's ``context``
        (and ``config.configurable``) over the fields it marks configurable. The default's
        fields are None: config/'s agent as it is."""
        overrides = settings_of(config, context, where="the run")
        if is_default(assistant_id):
            return resolve(ASSISTANT_ID, 1, {}, overrides)
        row = await self.row(assistant_id)
        stored = {**(row.config.get("configurable") or {}), **row.context}
        return resolve(row.id, row.version, stored, overrides)


def _page(limit: int, offset: int) -> None:
    if not 1 <= limit <= SEARCH_MAX or offset < 0:
        raise BadRequest(f"limit must be 1 to {SEARCH_MAX} and offset at least 0")


def _now() -> float:
    return time.time()
