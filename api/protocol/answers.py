"""What the Agent Protocol's controllers share: the parameters they name, the services they are
given, and the answers that wait for a run (its stream, its outcome, the headers that locate it)."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from litestar.datastructures import State
from litestar.di import Provide
from litestar.params import HeaderParameter, Parameter
from litestar.response import Stream

from api.chat.routes import SSE_HEADERS, SSE_MEDIA_TYPE
from api.ops import metrics
from api.protocol.runs.service import ASSISTANT_ID, ProtocolRuns
from api.protocol.stream.relay import ProtocolStream, cancelled_when_left
from api.protocol.threads.service import Threads
from api.protocol.threads.state import values_with_interrupts
from api.resources import Resources
from shared.errors import BadRequest

TAGS = ["agent protocol"]

ThreadId = Annotated[str, Parameter(description="The thread's id (a UUID): its conversation's id")]
RunIdParam = Annotated[str, Parameter(description="The run's id (a UUID)")]
CheckpointId = Annotated[str, Parameter(description="One of the thread's checkpoints (from its history)")]
Limit = Annotated[int, Parameter(description="How many to answer at most")]
Offset = Annotated[int, Parameter(description="How many to skip first")]
LastEventId = Annotated[
    str | None,
    HeaderParameter(
        name="Last-Event-ID", required=False, description="-1 (the whole run), or an id of this stream"
    ),
]


Subgraphs = Annotated[bool, Parameter(description="Changes nothing: the agent has no subgraphs")]
Select = Annotated[list[str] | None, Parameter(required=False, description="Not served: must be left out")]


def no_select(select: list[str] | None) -> None:
    if select:
        raise BadRequest("select is not served by Sophos: a state comes whole (docs/agent-protocol.md)")


def threads_of(state: State) -> Threads:
    return Threads.of(state.resources)


async def ended(resources: Resources, thread_id: str, run_id: str) -> None:
    """Wait for the run's terminal event."""
    stream = ProtocolStream(resources, thread_id, run_id, ASSISTANT_ID, ())
    await stream.open()
    await stream.outcome()


def protocol_runs_of(state: State) -> ProtocolRuns:
    resources: Resources = state.resources
    return ProtocolRuns(
        resources.chat, resources.runs, threads_of(state), resources.redis,
        functools.partial(ended, resources),
    )


DEPENDENCIES = {
    "threads": Provide(threads_of, sync_to_thread=False),
    "protocol_runs": Provide(protocol_runs_of, sync_to_thread=False),
}


def locations(thread_id: str, run_id: str, rejoin: str) -> dict[str, str]:
    run = f"/threads/{thread_id}/runs/{run_id}"
    return {"Location": f"{run}/{rejoin}", "Content-Location": run}


async def streamed(
    resources: Resources, thread_id: str, run_id: str, modes: tuple[str, ...], after: tuple[int, int],
    *, metadata: bool, headers: dict[str, str], cancel_on_disconnect: bool = False,
    then: Callable[[AsyncIterator[bytes]], AsyncIterator[bytes]] | None = None,
) -> Stream:
    """The run's stream as an answer; ``then`` wraps its content (what follows it)."""
    stream = ProtocolStream(resources, thread_id, run_id, ASSISTANT_ID, modes, after)
    await stream.open()  # before the answer starts: its errors still get an envelope
    content = stream.sse(metadata=metadata)
    if cancel_on_disconnect:
        content = cancelled_when_left(content, resources, run_id)
    if then is not None:
        content = then(content)
    return sse_answer(content, headers)


def sse_answer(content: AsyncIterator[bytes], headers: dict[str, str] | None = None) -> Stream:
    """An event stream as an answer, counted among the open streams (every SSE route's)."""
    all_headers = {**SSE_HEADERS, **(headers or {})}
    return Stream(metrics.counted(content), media_type=SSE_MEDIA_TYPE, headers=all_headers)



async def outcome(
    resources: Resources, threads: Threads, thread_id: str, run_id: str, *, errors_as_body: bool
) -> dict[str, Any]:
    """Wait for the run's end; the thread's values (or, with ``errors_as_body``, the error of a
    run that ended in error, as the Agent Server's ``runs.wait`` gives it: ``__error__``)."""
    stream = ProtocolStream(resources, thread_id, run_id, ASSISTANT_ID, ())
    await stream.open()
    status, error = await stream.outcome()
    if errors_as_body and status == "error":
        return {"__error__": error}
    return values_with_interrupts(await threads.state(thread_id))

