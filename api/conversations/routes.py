"""Conversations: the list, one conversation, its exports, its rename and its delete."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

import msgspec
import structlog
from litestar import Response, delete, get, patch
from litestar.openapi import ResponseSpec
from litestar.params import Parameter
from litestar.response import Stream

from api.auth.bearer import BROWSER_REQUESTED
from api.conversations.deletion import Deleted, Deletions
from api.conversations.renaming import Renames, has_control_characters
from api.conversations.schemas import (
    CheckpointLine,
    ConversationDetail,
    ConversationList,
    DeleteAccepted,
    Renamed,
    RenameRequest,
)
from api.http.disconnect import cancel_on_disconnect
from api.http.ids import parse_id
from api.http.openapi import ConversationId, errors
from api.resources import Resources
from shared.contracts.jobs import TITLE_MAX_CHARS
from shared.errors import BadRequest

MARKDOWN = "text/markdown; charset=utf-8"
NDJSON = "application/x-ndjson"
CONVERSATIONS_DEFAULT_LIMIT = 50
CONVERSATIONS_MAX_LIMIT = 200


@get(
    "/conversations",
    tags=["conversations"],
    summary="Conversations, newest first, in pages",
    description=(
        "Newest created first (`createdAt`, then `id`: a key that never changes, so a conversation "
        "updated while you page is neither skipped nor listed twice). Page with `cursor` = the previous "
        "page's `nextCursor`; `nextCursor` is null on the last page. With `q`: only the conversations "
        "whose title contains it, whatever the case (`%` and `_` are matched as themselves)."
    ),
    responses=errors(400, 401, 503),
)
async def list_conversations(
    resources: Resources,
    limit: Annotated[
        int, Parameter(ge=1, le=CONVERSATIONS_MAX_LIMIT, description="Conversations per page")
    ] = CONVERSATIONS_DEFAULT_LIMIT,
    cursor: Annotated[str | None, Parameter(description="`nextCursor` of the previous page")] = None,
    q: Annotated[
        str | None,
        Parameter(max_length=TITLE_MAX_CHARS, description="Only titles containing this, case aside"),
    ] = None,
) -> ConversationList:
    if q is not None and has_control_characters(q):
        raise BadRequest("q must not contain control characters")
    return await resources.conversations.page(limit=limit, cursor=cursor, query=q.strip() if q else None)


@delete(
    "/conversations/{conversation_id:str}",
    tags=["conversations"],
    status_code=202,
    summary="Delete a conversation: its messages, checkpoints, runs and events",
    description=(
        "The worker deletes it. 204 once it has (within a few seconds); 202 when it has not confirmed "
        "in time: it deletes the conversation when it takes the job. 409 while a run of it is queued or "
        "running; no run can be accepted for it while it is being deleted."
    ),
    responses={
        204: ResponseSpec(data_container=None, description="Deleted by the worker"),
        **errors(400, 401, 404, 409, 503),
    },
)
async def delete_conversation(
    conversation_id: ConversationId, resources: Resources
) -> Response[DeleteAccepted | None]:
    conversation_id = parse_id(conversation_id, "conversation id")
    structlog.contextvars.bind_contextvars(conversation_id=conversation_id)
    done = await Deletions(resources.store, resources.redis).delete(conversation_id)
    if done is Deleted.DONE:
        return Response(None, status_code=204)
    return Response(DeleteAccepted(conversation=conversation_id), status_code=202)


@patch(
    "/conversations/{conversation_id:str}",
    tags=["conversations"],
    status_code=200,
    summary="Rename a conversation",
    description=(
        "`{title}`: whitespace runs (newlines too) become single spaces; blank, longer than 200 "
        "characters or with a control character → 422 INVALID_TITLE. The worker writes it: 200 "
        "`renamed` once it has (within a few seconds), 202 `renaming` when it has not confirmed in "
        "time (it is busy with a run, or down): the title is written when it takes the job. 409 while "
        "its first run has not started."
    ),
    responses={
        202: ResponseSpec(data_container=Renamed, description="Queued: written when the worker takes it"),
        **errors(400, 401, 404, 409, 422, 503),
    },
)
async def rename_conversation(
    conversation_id: ConversationId, data: RenameRequest, resources: Resources
) -> Response[Renamed]:
    conversation_id = parse_id(conversation_id, "conversation id")
    structlog.contextvars.bind_contextvars(conversation_id=conversation_id)
    title, done = await Renames(resources.store, resources.redis).rename(conversation_id, data.title)
    if done:
        return Response(Renamed(conversation_id, title, "renamed"), status_code=200)
    return Response(Renamed(conversation_id, title, "renaming"), status_code=202)


@get(
    "/conversations/{conversation_id:str}",
    tags=["conversations"],
    summary="A conversation and the messages of its thread",
    responses=errors(400, 401, 404, 503),
    middleware=[cancel_on_disconnect],  # its thread is read in a reader process
)
async def get_conversation(conversation_id: ConversationId, resources: Resources) -> ConversationDetail:
    conversation_id = parse_id(conversation_id, "conversation id")
    structlog.contextvars.bind_contextvars(conversation_id=conversation_id)
    return await resources.conversations.detail(conversation_id)


#: lines of a JSON Lines export encoded into one chunk of its response
EXPORT_CHUNK_LINES = 64


def _encoded(lines: list[CheckpointLine]) -> Iterator[bytes]:
    encoder = msgspec.json.Encoder()
    for start in range(0, len(lines), EXPORT_CHUNK_LINES):
        buffer = bytearray()
        for line in lines[start : start + EXPORT_CHUNK_LINES]:
            encoder.encode_into(line, buffer, len(buffer))
            buffer += b"\n"
        yield bytes(buffer)


@get(
    "/conversations/{conversation_id:str}/export",
    tags=["conversations"],
    summary="Export a conversation",
    description=(
        "Markdown transcript (`text/markdown`) by default. With `format=jsonl`: `application/x-ndjson`, "
        "one line per checkpoint, oldest first: `{checkpoint_id, parent_checkpoint_id, step, source, "
        "run_id, created_at, next?, messages}` where `messages` are those the checkpoint added."
    ),
    media_type=MARKDOWN,
    responses=errors(400, 401, 404, 503),
    opt={BROWSER_REQUESTED: True},  # the page's download links
    middleware=[cancel_on_disconnect],  # its thread is read in a reader process
)
async def export_conversation(
    conversation_id: ConversationId,
    resources: Resources,
    format: Annotated[
        str | None, Parameter(description="`markdown` (default) or `jsonl`", required=False)
    ] = None,
) -> Response[str] | Stream:
    conversation_id = parse_id(conversation_id, "conversation id")
    structlog.contextvars.bind_contextvars(conversation_id=conversation_id)
    if format in (None, "", "markdown", "md"):
        text = await resources.conversations.markdown(conversation_id)
        filename = f"conversation-{conversation_id}.md"
        media_type = MARKDOWN
    elif format == "jsonl":
        lines = await resources.conversations.checkpoint_lines(conversation_id)
        # Encoded as sent, a few lines at a time: never the whole export as one string.
        return Stream(
            _encoded(lines), media_type=NDJSON,
            headers={"Content-Disposition": f'inline; filename="conversation-{conversation_id}.jsonl"'},
        )
    else:
        raise BadRequest(f"format must be markdown or jsonl, got {format[:32]!r}")
    return Response(
        text, media_type=media_type, headers={"Content-Disposition": f'inline; filename="{filename}"'}
    )
