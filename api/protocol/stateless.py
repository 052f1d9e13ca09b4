"""Runs without a thread (``POST /runs``, ``/runs/stream``, ``/runs/wait``): a run on a new,
temporary thread, which ``on_completion`` ``delete`` (the default) deletes once the run ended,
and ``keep`` keeps.

The thread is made as ``POST /threads`` makes one (owned by the caller), and the run is created
on it as on any thread (:meth:`ProtocolRuns.create`: the one submission path, its checks, the
quota and the rate limit). A refused run deletes the thread it was given: nothing changes.

The deletion follows the run from the API process that created it: after the stream's or the
wait's answer, or, for a run created in the background, from a task of that process waiting for
the run's end. A thread whose run outlives that process is kept, as ``keep`` would keep it,
until retention removes it (docs/agent-protocol.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
import msgspec
import structlog
from litestar import Controller, Response, post
from litestar.response import Stream

from api.chat.routes import SSE_MEDIA_TYPE
from api.http.disconnect import cancel_on_disconnect
from api.http.limits import FOLLOWS_A_RUN, limit_submissions
from api.http.openapi import errors
from api.protocol.routes import DEPENDENCIES, TAGS, _ended, _locations, _outcome, _stream
from api.protocol.run_input import RunCreate
from api.protocol.runs import ProtocolRuns
from api.protocol.threads import ThreadCreate, Threads
from api.resources import Resources
from shared.errors import BadRequest, SophosError

log = structlog.get_logger(__name__)

ON_COMPLETION = ("delete", "keep")
#: the tasks deleting a temporary thread once its run ends (held: a task nobody holds may vanish)
_CLEANUPS: set[asyncio.Task[None]] = set()


def _on_completion(body: RunCreate) -> tuple[RunCreate, bool]:
    """The run's body for its thread, and whether its thread is deleted once it ended."""
    if body.on_completion not in (None, *ON_COMPLETION):
        raise BadRequest("on_completion must be 'delete' or 'keep'")
    if body.if_not_exists is not None:
        raise BadRequest("if_not_exists is not taken by a run without a thread: its thread is new")
    return msgspec.structs.replace(body, on_completion=None), body.on_completion != "keep"


async def _create(
    protocol_runs: ProtocolRuns, body: RunCreate, *, streamed: bool = False
) -> tuple[str, dict[str, Any], Any, bool]:
    """A new thread and the run on it: the thread's id, the run, its options, and whether the
    thread goes once the run ended. A refused run leaves no thread behind."""
    run_body, temporary = _on_completion(body)
    thread_id = str(uuid.uuid4())
    await protocol_runs.threads.create(ThreadCreate(thread_id=thread_id, metadata=body.metadata))
    try:
        run, options = await protocol_runs.create(thread_id, run_body, streamed=streamed)
    except BaseException:
        with anyio.CancelScope(shield=True), contextlib.suppress(SophosError):
            await protocol_runs.threads.delete(thread_id)
        raise
    return thread_id, run, options, temporary


async def _delete_when_ended(
    resources: Resources, protocol_runs: ProtocolRuns, thread_id: str, run_id: str
) -> None:
    try:
        await _ended(resources, thread_id, run_id)
        await protocol_runs.delete_thread(thread_id)
        log.info("protocol.temporary_thread_deleted", conversation_id=thread_id, run_id=run_id)
    except SophosError as exc:
        log.warning(
            "protocol.temporary_thread_kept", conversation_id=thread_id, run_id=run_id, error=exc.message
        )


def _delete_later(resources: Resources, protocol_runs: ProtocolRuns, thread_id: str, run_id: str) -> None:
    task = asyncio.get_running_loop().create_task(
        _delete_when_ended(resources, protocol_runs, thread_id, run_id)
    )
    _CLEANUPS.add(task)
    task.add_done_callback(_CLEANUPS.discard)


async def _then_deleted(
    content: AsyncIterator[bytes], resources: Resources, protocol_runs: ProtocolRuns, thread_id: str,
    run_id: str,
) -> AsyncIterator[bytes]:
    """``content``, then (however it ended: its client may have left) the thread's deletion once
    the run ended."""
    try:
        async for chunk in content:
            yield chunk
    finally:
        _delete_later(resources, protocol_runs, thread_id, run_id)


class StatelessRunsController(Controller):
    path = "/runs"
    tags = TAGS
    dependencies = DEPENDENCIES

    @post("/", status_code=200, summary="Create a run on a new thread, in the background",
          responses=errors(401, 409, 422, 429, 503), guards=[limit_submissions])
    async def create(
        self, data: RunCreate, protocol_runs: ProtocolRuns, resources: Resources
    ) -> Response[Any]:
        thread_id, run, _, temporary = await _create(protocol_runs, data)
        if temporary:
            _delete_later(resources, protocol_runs, thread_id, run["run_id"])
        return Response(run, headers=_locations(thread_id, run["run_id"], "stream"))

    @post("/stream", status_code=200, media_type=SSE_MEDIA_TYPE,
          summary="Create a run on a new thread and stream it",
          responses=errors(401, 409, 422, 429, 503), guards=[limit_submissions])
    async def create_and_stream(
        self, data: RunCreate, protocol_runs: ProtocolRuns, resources: Resources
    ) -> Stream:
        thread_id, run, options, temporary = await _create(protocol_runs, data, streamed=True)
        then = functools.partial(
            _then_deleted, resources=resources, protocol_runs=protocol_runs, thread_id=thread_id,
            run_id=run["run_id"],
        )
        return await _stream(
            resources, thread_id, run["run_id"], options.stream_mode, (0, -1), metadata=True,
            headers=_locations(thread_id, run["run_id"], "stream"),
            cancel_on_disconnect=data.on_disconnect == "cancel", then=then if temporary else None,
        )

    @post("/wait", status_code=200, summary="Create a run on a new thread; its values once it ends",
          responses=errors(401, 409, 422, 429, 503), opt={FOLLOWS_A_RUN: True},
          middleware=[cancel_on_disconnect], guards=[limit_submissions])
    async def create_and_wait(
        self, data: RunCreate, protocol_runs: ProtocolRuns, resources: Resources, threads: Threads
    ) -> Response[Any]:
        with anyio.CancelScope(shield=True):  # a client that leaves stops the wait, not the creation
            thread_id, run, _, temporary = await _create(protocol_runs, data)
        try:
            body = await _outcome(resources, threads, thread_id, run["run_id"], errors_as_body=True)
        finally:
            if temporary:
                _delete_later(resources, protocol_runs, thread_id, run["run_id"])
        return Response(body, headers=_locations(thread_id, run["run_id"], "join"))


ROUTES = [StatelessRunsController]
