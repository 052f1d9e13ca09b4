"""``POST /api/chat`` (accept a message, an edit, a regenerate or a resume), ``GET /api/chat`` (its
events as SSE) and ``POST /api/conversations/{id}/branch`` (follow another branch: a run too)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

import msgspec
import structlog
from litestar import Request, get, post
from litestar.params import HeaderParameter, Parameter, QueryParameter
from litestar.response import Response, Stream

from api.auth.bearer import BROWSER_REQUESTED
from api.chat.forks import switch
from api.chat.relay import Ending, Relay, current_run, parse_last_event_id, run_of_conversation
from api.chat.schemas import BranchRequest, ChatAccepted, ChatRequest
from api.http.ids import parse_id
from api.http.limits import limit_submissions
from api.http.openapi import ConversationId, errors
from api.ops import metrics
from api.resources import Resources
from shared import tracing
from shared.errors import BadRequest

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
SSE_MEDIA_TYPE = "text/event-stream"


async def require_json_object(request: Request[Any, Any, Any]) -> None:
    """First check of the contract: the body is JSON (an object), before any field is looked at."""
    body = await request.body()
    try:
        decoded = msgspec.json.decode(body)
    except msgspec.DecodeError:
        raise BadRequest("body is not valid JSON") from None
    except RecursionError:
        # Thousands of nested arrays fit in a small body; the decoder gives up on them.
        raise BadRequest("body is nested too deeply") from None
    if not isinstance(decoded, dict):
        raise BadRequest("body must be a JSON object")


@post(
    "/chat",
    tags=["chat"],
    status_code=202,
    before_request=require_json_object,
    guards=[limit_submissions],
    summary="Send a message, or resume a conversation",
    description=(
        "Accepts `{message, conversation?}` (no conversation: a new one), `{resume: true, conversation}`, "
        "an edit `{message, conversation, replaces: <user message id>}` or a regenerate `{conversation, "
        "regenerate: <message id>}`: both fork the thread before that user message and keep the branch "
        "they leave (`abandonedCalls`: its tool calls that may have acted on the world). "
        "Checks, in order: JSON, message, resume needs a conversation, id format, existence, "
        "active run, resumable. With an `Idempotency-Key` header, a retry of the same request "
        "(within 24 h) gets the first answer instead of starting a second run."
    ),
    responses=errors(400, 401, 404, 409, 413, 422, 429, 503),
)
async def post_chat(
    request: Request[Any, Any, Any],
    data: ChatRequest,
    resources: Resources,
    idempotency_key: Annotated[
        str | None,
        HeaderParameter(
            name="Idempotency-Key", required=False,
            description="Any unique string (1-255 visible ASCII characters), the same for every retry.",
        ),
    ] = None,
) -> ChatAccepted:
    # The run's trace starts here (or continues the caller's): the job carries it to the worker.
    with tracing.span(
        "POST /api/chat", {"http.request.method": "POST", "http.route": "/api/chat"},
        kind="server", parent=tracing.incoming(request.headers),
    ):
        return await resources.chat.submit(data, idempotency_key)


async def _once(chunk: bytes) -> AsyncIterator[bytes]:
    yield chunk


@get(
    "/chat",
    tags=["chat"],
    summary="Stream the events of a conversation's current run (Server-Sent Events)",
    description=(
        "Events `token`, `trace`, `end`, `chat-error` (and `missed` when events the client has not seen "
        "are no longer kept), each with an `id`; comment pings while idle. Resume with `Last-Event-ID` "
        "or `lastEventId`; 204 when the client has already seen the run's terminal event."
    ),
    media_type="text/event-stream",
    response_description="An event stream: `id`, `event` and JSON `data` per event",
    responses=errors(400, 401, 404, 429, 503),
    opt={BROWSER_REQUESTED: True},  # EventSource cannot set a header
)
async def stream_chat(
    resources: Resources,
    conversation: Annotated[
        str | None, Parameter(description="The conversation whose current run to stream (a UUID)")
    ] = None,
    run: Annotated[
        str | None,
        Parameter(
            description=(
                "Stream this run of the conversation rather than its current one. Event ids count per "
                "run: a client that keeps one EventSource per run never resumes the wrong run."
            )
        ),
    ] = None,
    last_event_id_query: Annotated[
        str | None,
        QueryParameter(
            name="lastEventId", description="For clients that cannot set headers: as `Last-Event-ID`"
        ),
    ] = None,
    last_event_id_header: Annotated[
        str | None,
        HeaderParameter(
            name="Last-Event-ID", required=False,
            description="The id of the last event seen: the stream resumes right after it",
        ),
    ] = None,
) -> Response[Any]:
    conversation_id = parse_id(conversation, "conversation")
    after = parse_last_event_id(last_event_id_header, last_event_id_query)
    structlog.contextvars.bind_contextvars(conversation_id=conversation_id)
    if run is None:
        run_id = await current_run(resources.store, resources.redis, conversation_id)
    else:
        run_id = await run_of_conversation(
            resources.store, resources.redis, conversation_id, parse_id(run, "run")
        )
    structlog.contextvars.bind_contextvars(run_id=run_id)
    relay = Relay(
        redis=resources.redis,
        store=resources.store,
        feeds=resources.feeds,
        conversation_id=conversation_id,
        run_id=run_id,
        after=after,
        ping_ms=max(1, round(resources.settings.sse_ping_interval * 1000)),
        draining=resources.draining,
    )
    # Decided before the answer starts, so Redis or database errors still get an envelope.
    ending = await relay.ending()
    if ending is Ending.SEEN:
        return Response(None, status_code=204, headers=SSE_HEADERS)
    content = metrics.counted(_once(ending) if ending is not None else relay.events())
    return Stream(content, media_type=SSE_MEDIA_TYPE, headers=SSE_HEADERS)


@post(
    "/conversations/{conversation_id:str}/branch",
    tags=["conversations"],
    status_code=202,
    before_request=require_json_object,
    guards=[limit_submissions],
    summary="Follow another branch of the conversation",
    description=(
        "`{message}`: the first message of an alternative at a fork point of the current branch (a "
        "message's `branch.alternatives[i].message` in the conversation's detail). A run of kind `switch`: "
        "the worker records the branch as the one the conversation follows (its detail, exports and next "
        "message); wait for its `end` like any run. 409 while a run is queued or running, or while the "
        "conversation waits for a decision; nothing changes on a refusal."
    ),
    responses=errors(400, 401, 404, 409, 429, 503),
)
async def switch_branch(
    conversation_id: ConversationId, data: BranchRequest, resources: Resources
) -> ChatAccepted:
    return await switch(resources.chat, parse_id(conversation_id, "conversation id"), data.message)
