"""Runs without a thread (``POST /runs``, ``/runs/stream``, ``/runs/wait``): a run on a new,
temporary thread, which ``on_completion`` ``delete`` (the default) deletes once the run ended,
and ``keep`` keeps.

The thread is made as ``POST /threads`` makes one (owned by the caller), and the run is created
on it as on any thread (:meth:`ProtocolRuns.create`: the one submission path, its checks, the
quota and the rate limit). A refused run deletes the thread it was given: nothing changes.

The deletion is the worker's, as for any thread with a ``ttl`` (worker/upkeep/expiry.py): the
thread is made with a ``ttl`` and, once its run is accepted, made due at once; the run holds it
until its end, and the worker's sweep deletes it ``ttl`` after that end, through the delete job.
Nothing waits for the run in the API process, so a thread whose run outlives that process (a
restart, a crash) goes all the same. A run created in the background (``POST /runs``) has a
``ttl`` of :data:`DELETE_AFTER_RUN_MINUTES`; a run whose answer is given (``/runs/wait``,
``/runs/stream``) :data:`ANSWER_GRACE_MINUTES`, time to read its values from the thread, which the
answering process shortens to :data:`DELETE_AFTER_RUN_MINUTES` once it answered. A thread whose
API process stopped between its creation and its run's acceptance goes
:data:`ACCEPTANCE_MINUTES` after its creation.
"""

from __future__ import annotations

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
from redis.exceptions import RedisError

from api.chat.routes import SSE_MEDIA_TYPE
from api.http.disconnect import cancel_on_disconnect
from api.http.limits import FOLLOWS_A_RUN, limit_submissions
from api.http.openapi import errors
from api.protocol.answers import DEPENDENCIES, TAGS, locations, outcome, streamed
from api.protocol.runs.input import RunCreate
from api.protocol.runs.service import ProtocolRuns
from api.protocol.threads.bodies import ThreadCreate
from api.protocol.threads.service import Threads
from api.resources import Resources
from shared.errors import BadRequest, SophosError
from shared.redis.threads import ACCEPTANCE_MINUTES, ANSWER_GRACE_MINUTES, DELETE_AFTER_RUN_MINUTES

log = structlog.get_logger(__name__)

ON_COMPLETION = ("delete", "keep")


def _on_completion(body: RunCreate) -> tuple[RunCreate, bool]:
    """The run's body for its thread, and whether its thread is deleted once it ended."""
    if body.on_completion not in (None, *ON_COMPLETION):
        raise BadRequest("on_completion must be 'delete' or 'keep'")
    if body.if_not_exists is not None:
        raise BadRequest("if_not_exists is not taken by a run without a thread: its thread is new")
    return msgspec.structs.replace(body, on_completion=None), body.on_completion != "keep"


async def create_on_new_thread(
    protocol_runs: ProtocolRuns, body: RunCreate, *, streamed: bool = False, answered: bool = False
) -> tuple[str, dict[str, Any], Any, bool]:
    """A new thread and the run on it: the thread's id, the run, its options, and whether the
    thread goes once the run ended (``on_completion: delete``: the worker deletes it; ``answered``:
    the caller gives the run's answer, then calls :func:`answered`). A refused run leaves no
    thread behind."""
    run_body, temporary = _on_completion(body)
    thread_id = str(uuid.uuid4())
    threads = protocol_runs.threads
    if temporary:
        ttl = ANSWER_GRACE_MINUTES if answered else DELETE_AFTER_RUN_MINUTES
        await threads.create(
            ThreadCreate(thread_id=thread_id, metadata=body.metadata, ttl=ttl),
            first_look_minutes=ACCEPTANCE_MINUTES,
        )
    else:
        await threads.create(ThreadCreate(thread_id=thread_id, metadata=body.metadata))
    try:
        run, options = await protocol_runs.create(thread_id, run_body, streamed=streamed)
    except BaseException:
        with anyio.CancelScope(shield=True), contextlib.suppress(SophosError):
            await threads.delete(thread_id)
        raise
    if temporary:
        await threads.records.due_now(thread_id)
    return thread_id, run, options, temporary


async def answered(threads: Threads, thread_id: str) -> None:
    """The answer of a run on a temporary thread was given: the thread goes once the run ended."""
    with anyio.CancelScope(shield=True), contextlib.suppress(SophosError, RedisError):
        await threads.records.due_now(thread_id, DELETE_AFTER_RUN_MINUTES)


async def _then_answered(
    content: AsyncIterator[bytes], threads: Threads, thread_id: str
) -> AsyncIterator[bytes]:
    """``content``, then (however it ended: its client may have left) :func:`answered`."""
    try:
        async for chunk in content:
            yield chunk
    finally:
        await answered(threads, thread_id)


class StatelessRunsController(Controller):
    path = "/runs"
    tags = TAGS
    dependencies = DEPENDENCIES

    @post("/", status_code=200, summary="Create a run on a new thread, in the background",
          responses=errors(401, 409, 422, 429, 503), guards=[limit_submissions])
    async def create(self, data: RunCreate, protocol_runs: ProtocolRuns) -> Response[Any]:
        thread_id, run, _, _ = await create_on_new_thread(protocol_runs, data)
        return Response(run, headers=locations(thread_id, run["run_id"], "stream"))

    @post("/stream", status_code=200, media_type=SSE_MEDIA_TYPE,
          summary="Create a run on a new thread and stream it",
          responses=errors(401, 409, 422, 429, 503), guards=[limit_submissions])
    async def create_and_stream(
        self, data: RunCreate, protocol_runs: ProtocolRuns, resources: Resources
    ) -> Stream:
        thread_id, run, options, temporary = await create_on_new_thread(
            protocol_runs, data, streamed=True, answered=True
        )
        then = functools.partial(_then_answered, threads=protocol_runs.threads, thread_id=thread_id)
        return await streamed(
            resources, thread_id, run["run_id"], options.stream_mode, (0, -1), metadata=True,
            headers=locations(thread_id, run["run_id"], "stream"),
            cancel_on_disconnect=data.on_disconnect == "cancel", then=then if temporary else None,
        )

    @post("/wait", status_code=200, summary="Create a run on a new thread; its values once it ends",
          responses=errors(401, 409, 422, 429, 503), opt={FOLLOWS_A_RUN: True},
          middleware=[cancel_on_disconnect], guards=[limit_submissions])
    async def create_and_wait(
        self, data: RunCreate, protocol_runs: ProtocolRuns, resources: Resources, threads: Threads
    ) -> Response[Any]:
        with anyio.CancelScope(shield=True):  # a client that leaves stops the wait, not the creation
            thread_id, run, _, temporary = await create_on_new_thread(protocol_runs, data, answered=True)
        try:
            body = await outcome(resources, threads, thread_id, run["run_id"], errors_as_body=True)
        finally:
            if temporary:
                await answered(threads, thread_id)
        return Response(body, headers=locations(thread_id, run["run_id"], "join"))


ROUTES = [StatelessRunsController]
