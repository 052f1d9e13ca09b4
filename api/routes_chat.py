"""``POST /api/chat`` (accept a message or a resume) and ``GET /api/chat`` (its events as SSE)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

import msgspec
import structlog
from litestar import Request, get, post
from litestar.params import Parameter
from litestar.response import ServerSentEvent, ServerSentEventMessage

from api import metrics
from api.ids import parse_id
from api.limits import limit_submissions
from api.openapi import errors
from api.relay import Relay, current_run, parse_last_event_id
from api.resources import Resources
from api.schemas import ChatAccepted, ChatRequest
from shared.errors import BadRequest

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def require_json_object(request: Request[Any, Any, Any]) -> None:
    """First check of the contract: the body is JSON (an object), before any field is looked at."""
    body = await request.body()
    try:
        decoded = msgspec.json.decode(body)
    except msgspec.DecodeError:
        raise BadRequest("body is not valid JSON") from None
    if not isinstance(decoded, dict):
        raise BadRequest("body must be a JSON object")


@post(
    "/chat",
    status_code=202,
    before_request=require_json_object,
    guards=[limit_submissions],
    summary="Send a message, or resume a conversation",
    description=(
        "Accepts `{message, conversation?}` (no conversation: a new one) or `{resume: true, conversation}`. "
        "Checks, in order: JSON, message, resume needs a conversation, id format, existence, "
        "active run, resumable."
    ),
    responses=errors(400, 401, 404, 409, 413, 429, 503),
)
async def post_chat(data: ChatRequest, resources: Resources) -> ChatAccepted:
    return await resources.chat.submit(data)


async def _once(event: ServerSentEventMessage) -> AsyncIterator[ServerSentEventMessage]:
    yield event


@get(
    "/chat",
    summary="Stream the events of a conversation's current run (Server-Sent Events)",
    description=(
        "Events `token`, `trace`, `end`, `chat-error` (and `missed` when trimmed entries were skipped), "
        "each with an `id`; comment pings while idle. Resume with `Last-Event-ID` or `lastEventId`."
    ),
    media_type="text/event-stream",
    response_description="An event stream: `id`, `event` and JSON `data` per event",
    responses=errors(400, 401, 404, 429, 503),
)
async def stream_chat(
    resources: Resources,
    conversation: str | None = None,
    last_event_id_query: Annotated[str | None, Parameter(query="lastEventId")] = None,
    last_event_id_header: Annotated[str | None, Parameter(header="Last-Event-ID", required=False)] = None,
) -> ServerSentEvent:
    conversation_id = parse_id(conversation, "conversation")
    after = parse_last_event_id(last_event_id_header, last_event_id_query)
    structlog.contextvars.bind_contextvars(conversation_id=conversation_id)
    run_id = await current_run(resources.store, resources.redis, conversation_id)
    structlog.contextvars.bind_contextvars(run_id=run_id)
    relay = Relay(
        redis=resources.redis,
        store=resources.store,
        conversation_id=conversation_id,
        run_id=run_id,
        after=after,
        ping_ms=max(1, round(resources.settings.sse_ping_interval * 1000)),
        draining=resources.draining,
    )
    # Decided before the answer starts, so Redis or database errors still get an envelope.
    ending = await relay.ending()
    content = metrics.counted(_once(ending) if ending is not None else relay.events())
    return ServerSentEvent(content, headers=SSE_HEADERS)
