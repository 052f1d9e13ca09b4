"""``update_state`` (``POST /threads/{id}/state``): a person correcting the thread.

The update is a run of Sophos's own, of kind ``update`` (worker/run/updates.py), submitted
through the one path (:meth:`ChatService.update_state`): the same claim of the thread, so a
thread a run holds is refused with 409 ``SESSION_IN_PROGRESS`` and one waiting for a decision
with 409 ``APPROVAL_PENDING``, the same quota, rate limit and queue. The answer comes once the
worker has written it: the checkpoint it made, as the Agent Server answers. Like a rollback's
switch, the run is listed on ``/api/runs`` and left out of the protocol's ``runs.list``.
"""

from __future__ import annotations

from typing import Any

import msgspec
import structlog
from litestar import Controller, post

from api.http.limits import limit_submissions
from api.http.openapi import errors
from api.protocol.answers import DEPENDENCIES, TAGS, ThreadId
from api.protocol.runs.commands import as_node_of, values_of
from api.protocol.runs.service import ProtocolRuns
from api.protocol.stream.relay import ProtocolStream
from api.protocol.threads.bodies import thread_id_of
from api.resources import Resources
from shared.contracts.protocol import ASSISTANT_ID
from shared.errors import BadRequest

log = structlog.get_logger(__name__)

class ThreadStateUpdate(msgspec.Struct):
    """Body of ``POST /threads/{id}/state`` (the SDK's ``threads.update_state``)."""

    values: Any = None
    as_node: str | None = None
    checkpoint: dict[str, Any] | None = None
    checkpoint_id: str | None = None


def check(body: ThreadStateUpdate) -> tuple[dict[str, Any], str | None]:
    if body.checkpoint is not None or body.checkpoint_id is not None:
        raise BadRequest(
            "checkpoint is not served on update_state by Sophos: an update follows the thread's "
            "current branch (docs/agent-protocol.md)"
        )
    return values_of(body.values), as_node_of(body.as_node)


class ThreadStateController(Controller):
    path = "/threads"
    tags = TAGS
    dependencies = DEPENDENCIES

    @post("/{thread_id:str}/state", status_code=200,
          summary="Update the thread's state as a node would (values, as_node); its new checkpoint",
          responses=errors(401, 404, 409, 422, 429, 503), guards=[limit_submissions])
    async def update_state(
        self, thread_id: ThreadId, data: ThreadStateUpdate, protocol_runs: ProtocolRuns,
        resources: Resources,
    ) -> dict[str, Any]:
        tid = thread_id_of(thread_id)
        values, as_node = check(data)
        await protocol_runs.threads.find(tid)
        accepted = await protocol_runs.chat.update_state(tid, values, as_node)
        log.info("protocol.state_updating", conversation_id=tid, run_id=accepted.run, as_node=as_node)
        stream = ProtocolStream(resources, tid, accepted.run, ASSISTANT_ID, ())
        await stream.open()
        status, error = await stream.outcome()
        if status != "success":
            raise BadRequest(f"the update was not written: {error.get('message') or status}")
        state = await protocol_runs.threads.state(tid)
        return {"checkpoint": state["checkpoint"]}


ROUTES = [ThreadStateController]
