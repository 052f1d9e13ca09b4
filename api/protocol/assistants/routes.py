"""The assistants' routes (``client.assistants``): they only translate, onto
:class:`api.protocol.assistants.service.Assistants` (docs/agent-protocol.md, "Assistants")."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Controller, Response, delete, get, patch, post
from litestar.datastructures import State
from litestar.di import Provide
from litestar.params import Parameter

from api.http.openapi import errors
from api.protocol.assistants.agent import graph as agent_graph
from api.protocol.assistants.agent import schemas
from api.protocol.assistants.service import (
    AssistantCount,
    AssistantCreate,
    Assistants,
    AssistantSearch,
    AssistantUpdate,
    SetLatest,
    VersionSearch,
)
from api.resources import Resources

TAGS = ["agent protocol"]
AssistantId = Annotated[str, Parameter(description="`agent` (the default) or the assistant's id (a UUID)")]


def _assistants(state: State) -> Assistants:
    resources: Resources = state.resources
    return Assistants(resources.store, resources.redis)


DEPENDENCIES = {"assistants": Provide(_assistants, sync_to_thread=False)}


class AssistantsController(Controller):
    path = "/assistants"
    tags = TAGS
    dependencies = DEPENDENCIES

    @post("/", status_code=200, summary="Create an assistant: a configuration of the agent",
          responses=errors(401, 404, 409, 422, 503))
    async def create(self, data: AssistantCreate, assistants: Assistants) -> dict[str, Any]:
        return await assistants.create(data)

    @post("/search", status_code=200, summary="Assistants, newest first (the default among them)",
          responses=errors(401, 422))
    async def search(self, data: AssistantSearch, assistants: Assistants) -> Response[list[dict[str, Any]]]:
        page, following = await assistants.search(data)
        headers = {"X-Pagination-Next": str(following)} if following is not None else {}
        return Response(page, headers=headers)

    @post("/count", status_code=200, summary="How many assistants match", responses=errors(401, 422))
    async def count(self, data: AssistantCount, assistants: Assistants) -> int:
        return len(await assistants.matching(data.metadata, data.graph_id, data.name))

    @get("/{assistant_id:str}", summary="An assistant at its latest version", responses=errors(401, 404, 422))
    async def get_assistant(self, assistant_id: AssistantId, assistants: Assistants) -> dict[str, Any]:
        return await assistants.get(assistant_id)

    @patch("/{assistant_id:str}", summary="Update an assistant: a new version, made its latest",
           responses=errors(401, 404, 409, 422, 503))
    async def update(
        self, assistant_id: AssistantId, data: AssistantUpdate, assistants: Assistants
    ) -> dict[str, Any]:
        return await assistants.update(assistant_id, data)

    @delete("/{assistant_id:str}", status_code=204, summary="Delete an assistant and its versions",
            responses=errors(401, 404, 409, 422, 503))
    async def delete_assistant(
        self, assistant_id: AssistantId, assistants: Assistants,
        delete_threads: Annotated[bool, Parameter(description="Not served: must be false")] = False,
    ) -> None:
        await assistants.delete(assistant_id, delete_threads=delete_threads)

    @post("/{assistant_id:str}/versions", status_code=200, summary="An assistant's versions, newest first",
          responses=errors(401, 404, 422))
    async def versions(
        self, assistant_id: AssistantId, data: VersionSearch, assistants: Assistants
    ) -> list[dict[str, Any]]:
        return await assistants.versions(assistant_id, data)

    @post("/{assistant_id:str}/latest", status_code=200, summary="Make one of its versions the latest",
          responses=errors(401, 404, 409, 422, 503))
    async def set_latest(
        self, assistant_id: AssistantId, data: SetLatest, assistants: Assistants
    ) -> dict[str, Any]:
        return await assistants.set_latest(assistant_id, data.version)

    @get("/{assistant_id:str}/graph", summary="The agent's graph: its nodes and edges",
         responses=errors(401, 404, 422))
    async def get_graph(
        self, assistant_id: AssistantId, assistants: Assistants,
        xray: Annotated[str | None, Parameter(description="Ignored: the agent has no subgraphs")] = None,
    ) -> dict[str, Any]:
        await assistants.get(assistant_id)
        return agent_graph()

    @get("/{assistant_id:str}/schemas", summary="What a run takes and the state it keeps",
         responses=errors(401, 404, 422))
    async def get_schemas(self, assistant_id: AssistantId, assistants: Assistants) -> dict[str, Any]:
        await assistants.get(assistant_id)
        return schemas()

    @get("/{assistant_id:str}/subgraphs", summary="The agent's subgraphs: none",
         responses=errors(401, 404, 422))
    async def get_subgraphs(self, assistant_id: AssistantId, assistants: Assistants) -> dict[str, Any]:
        await assistants.get(assistant_id)
        return {}
