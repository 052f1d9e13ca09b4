"""The Agent Protocol's routes, at the root paths the LangGraph SDKs use. They only translate:
parse, call the thread or run service, shape the answer (docs/agent-protocol.md)."""

from __future__ import annotations

from typing import Annotated, Any

import anyio
import structlog
from litestar import Controller, Request, Response, WebSocket, delete, get, patch, post, websocket
from litestar.params import Parameter
from litestar.response import Stream

from api.chat.routes import SSE_MEDIA_TYPE
from api.http.disconnect import cancel_on_disconnect
from api.http.limits import FOLLOWS_A_RUN, limit_submissions
from api.http.openapi import errors
from api.protocol.answers import (
    DEPENDENCIES,
    TAGS,
    CheckpointId,
    LastEventId,
    Limit,
    Offset,
    RunIdParam,
    Select,
    Subgraphs,
    ThreadId,
    locations,
    no_select,
    outcome,
    sse_answer,
    streamed,
)
from api.protocol.assistants.routes import AssistantsController
from api.protocol.crons import CronsController
from api.protocol.runs.input import RunCreate
from api.protocol.runs.service import ProtocolRuns
from api.protocol.store import StoreController
from api.protocol.stream import session
from api.protocol.stream.session_events import Subscription
from api.protocol.stream.thread import ThreadStream, thread_after, thread_modes
from api.protocol.stream.translate import after_id, stream_modes
from api.protocol.threads import search as thread_search
from api.protocol.threads.bodies import (
    StateAt,
    ThreadCreate,
    ThreadHistory,
    ThreadSearch,
    ThreadUpdate,
    thread_id_of,
)
from api.protocol.threads.copies import Copies
from api.protocol.threads.service import Threads
from api.resources import Resources
from shared.errors import BadRequest

log = structlog.get_logger(__name__)

class ServerController(Controller):
    tags = TAGS

    @get("/ok", summary="Liveness, as the Agent Server answers it", opt={"public": True})
    async def ok(self) -> dict[str, bool]:
        return {"ok": True}

    @get("/openapi.json", summary="The OpenAPI document (the one /schema/openapi.json serves)",
         opt={"public": True}, include_in_schema=False)
    async def openapi(self, request: Request[Any, Any, Any]) -> dict[str, Any]:
        # Where the Agent Server serves it; public like /schema, it holds no data.
        return request.app.openapi_schema.to_schema()

    @get("/info", summary="What this server is and serves of the Agent Protocol")
    async def info(self) -> dict[str, Any]:
        return {
            "version": "sophos",
            "flags": {"assistants": True, "crons": True, "langsmith": False, "thread_ttl": False},
            "metadata": {"engine": "sophos", "docs": "docs/agent-protocol.md"},
        }


class ThreadsController(Controller):
    path = "/threads"
    tags = TAGS
    dependencies = DEPENDENCIES

    @post("/", status_code=200, summary="Create a thread (empty until its first run)",
          responses=errors(401, 409, 422))
    async def create(self, data: ThreadCreate, threads: Threads) -> dict[str, Any]:
        return (await threads.create(data)).shape()

    @post("/search", status_code=200, summary="Threads, newest first", responses=errors(401, 422))
    async def search(self, data: ThreadSearch, threads: Threads) -> list[dict[str, Any]]:
        return await thread_search.search(threads, data)

    @post("/count", status_code=200, summary="How many threads match (metadata, status)",
          responses=errors(401, 422))
    async def count(self, data: ThreadSearch, threads: Threads) -> int:
        return await thread_search.count(threads, data)

    @get("/{thread_id:str}/stream", media_type=SSE_MEDIA_TYPE,
         summary="A thread's stream (threads.join_stream): each of its runs as they come",
         responses=errors(401, 404, 422, 429))
    async def thread_stream(
        self, thread_id: ThreadId, threads: Threads, protocol_runs: ProtocolRuns, resources: Resources,
        last_event_id: LastEventId = None,
        stream_mode: Annotated[
            list[str] | None,
            Parameter(required=False, description="run_modes (the default): each run in its own modes"),
        ] = None,
    ) -> Stream:
        tid = thread_id_of(thread_id)
        thread_modes([m for m in stream_mode or [] if m])
        after = thread_after(last_event_id)
        await threads.find(tid)
        if after is not None:
            after = (await protocol_runs.check(tid, after[0]), after[1])

        async def modes_of(run_id: str) -> tuple[str, ...]:
            return (await protocol_runs.options(run_id)).stream_mode

        content = ThreadStream(resources, tid, modes_of, after).sse()
        return sse_answer(content)

    @post("/{thread_id:str}/commands", status_code=200,
          summary="A command of the SDK's thread streaming session (threads.stream)",
          responses=errors(401, 404, 409, 422, 429, 503), guards=[limit_submissions])
    async def thread_command(
        self, thread_id: ThreadId, data: dict[str, Any], protocol_runs: ProtocolRuns
    ) -> dict[str, Any]:
        return await session.command(protocol_runs, thread_id_of(thread_id), data)

    @post("/{thread_id:str}/stream/events", status_code=200, media_type=SSE_MEDIA_TYPE,
          summary="An event stream of the SDK's thread streaming session (threads.stream), over SSE",
          responses=errors(401, 404, 422, 429))
    async def thread_events(
        self, thread_id: ThreadId, data: dict[str, Any], threads: Threads, protocol_runs: ProtocolRuns,
        resources: Resources,
    ) -> Stream:
        tid = thread_id_of(thread_id)
        subscription = Subscription.parse(data)
        await threads.find(tid)

        async def assistant_of(run_id: str) -> str:
            return (await protocol_runs.options(run_id)).assistant_id

        stream = session.SessionStream(
            resources, tid, subscription, lambda: session.runs_in_order(protocol_runs, tid), assistant_of
        )
        content = stream.sse(await stream.first())
        return sse_answer(content)

    @websocket("/{thread_id:str}/stream/events")
    async def thread_events_websocket(self, socket: WebSocket[Any, Any, Any]) -> None:
        # Closed as the SDK reads a refusal (4000 + the status, 404 as the other unserved parts).
        await socket.accept()
        await socket.close(code=4404, reason=session.WEBSOCKET_REFUSED)

    @get("/{thread_id:str}", summary="A thread, with its values", responses=errors(401, 404, 422))
    async def get_thread(self, thread_id: ThreadId, threads: Threads) -> dict[str, Any]:
        return await threads.get(thread_id_of(thread_id))

    @patch("/{thread_id:str}", summary="Merge metadata into a thread's", responses=errors(401, 404, 422))
    async def update_thread(
        self, thread_id: ThreadId, data: ThreadUpdate, threads: Threads
    ) -> dict[str, Any]:
        return await threads.update(thread_id_of(thread_id), data)

    @post("/{thread_id:str}/copy", status_code=200,
          summary="A new thread, the caller's, holding a copy of the thread's history",
          responses=errors(401, 404, 409, 422, 503))
    async def copy_thread(self, thread_id: ThreadId, threads: Threads) -> dict[str, Any]:
        return await Copies(threads).copy(thread_id_of(thread_id))

    @post("/{thread_id:str}/history", status_code=200,
          summary="The thread's checkpoints, newest first, each as a state", responses=errors(401, 404, 422))
    async def history(
        self, thread_id: ThreadId, data: ThreadHistory, threads: Threads
    ) -> list[dict[str, Any]]:
        return await threads.history(thread_id_of(thread_id), data)

    @get("/{thread_id:str}/history", summary="The thread's checkpoints, newest first (limit, before)",
         responses=errors(401, 404, 422))
    async def history_by_get(
        self, thread_id: ThreadId, threads: Threads, limit: Limit = 10,
        before: Annotated[str | None, Parameter(description="A checkpoint id: only older ones")] = None,
    ) -> list[dict[str, Any]]:
        return await threads.history(thread_id_of(thread_id), ThreadHistory(limit=limit, before=before))

    @delete("/{thread_id:str}", status_code=204,
            summary="Delete a thread and its conversation (its runs cancelled first)",
            responses=errors(401, 404, 409, 422))
    async def delete_thread(self, thread_id: ThreadId, protocol_runs: ProtocolRuns) -> None:
        await protocol_runs.delete_thread(thread_id_of(thread_id))

    @get("/{thread_id:str}/state", summary="The thread's state: values, next, tasks, checkpoint",
         responses=errors(401, 404, 422))
    async def state(
        self, thread_id: ThreadId, threads: Threads, subgraphs: Subgraphs = False, select: Select = None
    ) -> dict[str, Any]:
        no_select(select)
        return await threads.state(thread_id_of(thread_id))

    @get("/{thread_id:str}/state/{checkpoint_id:str}", summary="The thread's state at one of its checkpoints",
         responses=errors(401, 404, 422))
    async def state_at(
        self, thread_id: ThreadId, checkpoint_id: CheckpointId, threads: Threads,
        subgraphs: Subgraphs = False, select: Select = None,
    ) -> dict[str, Any]:
        no_select(select)
        return await threads.state(thread_id_of(thread_id), checkpoint_id)

    @post("/{thread_id:str}/state/checkpoint", status_code=200,
          summary="The thread's state at one of its checkpoints", responses=errors(401, 404, 422))
    async def state_at_checkpoint(
        self, thread_id: ThreadId, data: StateAt, threads: Threads
    ) -> dict[str, Any]:
        no_select(data.select)
        if data.checkpoint.get("checkpoint_ns"):
            raise BadRequest("checkpoint_ns must be empty: the agent has no subgraphs")
        checkpoint_id = data.checkpoint.get("checkpoint_id")
        if not isinstance(checkpoint_id, str):
            raise BadRequest("checkpoint must carry a checkpoint_id")
        return await threads.state(thread_id_of(thread_id), checkpoint_id)


class RunsController(Controller):
    path = "/threads/{thread_id:str}/runs"
    tags = TAGS
    dependencies = DEPENDENCIES

    @post("/", status_code=200, summary="Create a run in the background (no input: resume the thread)",
          responses=errors(401, 404, 409, 422, 429, 503), guards=[limit_submissions])
    async def create(
        self, thread_id: ThreadId, data: RunCreate, protocol_runs: ProtocolRuns
    ) -> Response[Any]:
        tid = thread_id_of(thread_id)
        run, _ = await protocol_runs.create(tid, data)
        return Response(run, headers=locations(tid, run["run_id"], "stream"))

    @post("/stream", status_code=200, media_type=SSE_MEDIA_TYPE,
          summary="Create a run and stream it: metadata, then each stream mode's events, then end",
          responses=errors(401, 404, 409, 422, 429, 503), guards=[limit_submissions])
    async def create_and_stream(
        self, thread_id: ThreadId, data: RunCreate, protocol_runs: ProtocolRuns, resources: Resources
    ) -> Stream:
        tid = thread_id_of(thread_id)
        run, options = await protocol_runs.create(tid, data, streamed=True)
        return await streamed(
            resources, tid, run["run_id"], options.stream_mode, (0, -1), metadata=True,
            headers=locations(tid, run["run_id"], "stream"),
            cancel_on_disconnect=data.on_disconnect == "cancel",
        )

    @post("/wait", status_code=200, summary="Create a run and answer with the thread's values when it ends",
          responses=errors(401, 404, 409, 422, 429, 503), opt={FOLLOWS_A_RUN: True},
          middleware=[cancel_on_disconnect], guards=[limit_submissions])
    async def create_and_wait(
        self, thread_id: ThreadId, data: RunCreate, protocol_runs: ProtocolRuns, resources: Resources,
        threads: Threads,
    ) -> Response[Any]:
        tid = thread_id_of(thread_id)
        with anyio.CancelScope(shield=True):  # a client that leaves stops the wait, not the creation
            run, _ = await protocol_runs.create(tid, data)
        body = await outcome(resources, threads, tid, run["run_id"], errors_as_body=True)
        return Response(body, headers=locations(tid, run["run_id"], "join"))

    @get("/", summary="The thread's runs, newest first", responses=errors(401, 404, 422))
    async def list_runs(
        self, thread_id: ThreadId, protocol_runs: ProtocolRuns, limit: Limit = 10, offset: Offset = 0,
        status: Annotated[str | None, Parameter(description="Only runs with this (SDK) status")] = None,
    ) -> list[dict[str, Any]]:
        return await protocol_runs.list(thread_id_of(thread_id), limit=limit, offset=offset, status=status)

    @get("/{run_id:str}", summary="A run", responses=errors(401, 404, 422))
    async def get_run(
        self, thread_id: ThreadId, run_id: RunIdParam, protocol_runs: ProtocolRuns
    ) -> dict[str, Any]:
        return await protocol_runs.get(thread_id_of(thread_id), run_id)

    @post("/{run_id:str}/cancel", status_code=202, summary="Cancel a run (queued or running)",
          responses=errors(401, 404, 409, 422, 429), opt={FOLLOWS_A_RUN: "wait"},
          middleware=[cancel_on_disconnect])
    async def cancel(
        self, thread_id: ThreadId, run_id: RunIdParam, protocol_runs: ProtocolRuns, resources: Resources,
        threads: Threads,
        wait: Annotated[bool, Parameter(description="Answer once the run has ended")] = False,
        action: Annotated[str, Parameter(description=(
            "`interrupt`, or `rollback`: then the thread goes back to where the run started "
            "(answered once done); any other action means `interrupt`"
        ))] = "interrupt",
    ) -> Response[Any]:
        tid = thread_id_of(thread_id)
        with anyio.CancelScope(shield=True):  # a client that leaves stops the wait, not the cancel
            await protocol_runs.cancel(tid, run_id, action)
        if not wait:
            return Response(None, status_code=202)
        # As the Agent Server: once the run has ended, the thread's values.
        values = await outcome(resources, threads, tid, run_id.lower(), errors_as_body=False)
        return Response(values, status_code=200)

    @get("/{run_id:str}/join", summary="Wait for a run to end; the thread's values",
         responses=errors(401, 404, 422, 429), opt={FOLLOWS_A_RUN: True},
         middleware=[cancel_on_disconnect])
    async def join(
        self, thread_id: ThreadId, run_id: RunIdParam, protocol_runs: ProtocolRuns, resources: Resources,
        threads: Threads,
    ) -> dict[str, Any]:
        tid = thread_id_of(thread_id)
        rid = await protocol_runs.check(tid, run_id)
        return await outcome(resources, threads, tid, rid, errors_as_body=False)

    @get("/{run_id:str}/stream", media_type=SSE_MEDIA_TYPE,
         summary="Join a run's stream (Last-Event-ID: -1 or none replays it from its start)",
         responses=errors(401, 404, 422, 429))
    async def join_stream(
        self, thread_id: ThreadId, run_id: RunIdParam, protocol_runs: ProtocolRuns, resources: Resources,
        last_event_id: LastEventId = None,
        stream_mode: Annotated[
            list[str] | None,
            Parameter(required=False, description="The modes to stream; by default the run's own"),
        ] = None,
        cancel_on_disconnect: Annotated[
            bool, Parameter(description="Cancel the run if this stream's client leaves before its end")
        ] = False,
    ) -> Stream:
        tid = thread_id_of(thread_id)
        rid = await protocol_runs.check(tid, run_id)
        after = after_id(last_event_id)
        asked = [m for m in stream_mode or [] if m]
        modes = stream_modes(asked) if asked else (await protocol_runs.options(rid)).stream_mode
        # A join from the start begins with ``metadata``, as the Agent Server's does.
        return await streamed(
            resources, tid, rid, modes, after, metadata=after == (0, -1), headers={},
            cancel_on_disconnect=cancel_on_disconnect,
        )


ROUTES = [ServerController, AssistantsController, ThreadsController, RunsController, CronsController,
          StoreController]
