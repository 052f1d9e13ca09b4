"""``threads.prune`` (``POST /threads/prune``): many threads deleted at once.

Strategy ``delete`` (the default) deletes each thread as ``DELETE /threads/{id}`` does (its runs
cancelled first, then it and its conversation deleted); a thread the caller cannot see, or that
is gone, is not counted. ``keep_latest`` (dropping all but a thread's latest checkpoint) is
refused by name: the ledger and the branches need the checkpoints (docs/agent-protocol.md).
"""

from __future__ import annotations

from typing import Any

import msgspec
import structlog
from litestar import Controller, post

from api.http.openapi import errors
from api.protocol.answers import DEPENDENCIES, TAGS
from api.protocol.runs.service import ProtocolRuns
from api.protocol.threads.bodies import thread_id_of
from shared.errors import BadRequest, NotFound

log = structlog.get_logger(__name__)

#: at most this many threads in one prune
MAX_PRUNED = 100


class ThreadPrune(msgspec.Struct):
    thread_ids: list[str]
    strategy: str = "delete"


class PruneController(Controller):
    path = "/threads"
    tags = TAGS
    dependencies = DEPENDENCIES

    @post("/prune", status_code=200, summary="Delete many threads (strategy delete); how many were",
          responses=errors(401, 409, 422))
    async def prune(self, data: ThreadPrune, protocol_runs: ProtocolRuns) -> dict[str, Any]:
        if data.strategy == "keep_latest":
            raise BadRequest(
                "strategy keep_latest is not served by Sophos: a thread's checkpoints are kept, the "
                "ledger of tool effects and the branches need them (docs/agent-protocol.md)"
            )
        if data.strategy != "delete":
            raise BadRequest("strategy must be 'delete' (or 'keep_latest', which Sophos does not serve)")
        if len(data.thread_ids) > MAX_PRUNED:
            raise BadRequest(f"thread_ids must hold at most {MAX_PRUNED} ids")
        ids = list(dict.fromkeys(thread_id_of(i) for i in data.thread_ids))
        pruned = 0
        for thread_id in ids:
            try:
                await protocol_runs.delete_thread(thread_id)
            except NotFound:
                continue  # gone, or not the caller's: not counted
            pruned += 1
        log.info("protocol.threads_pruned", asked=len(ids), pruned=pruned)
        return {"pruned_count": pruned}


ROUTES = [PruneController]
