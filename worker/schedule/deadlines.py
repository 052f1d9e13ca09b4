"""``APPROVAL_TIMEOUT``: a tool call the user has not decided in time is rejected by itself.

A conversation waits from the moment its run is recorded ``waiting`` (the run row's
``finished_at``: in the database, so the deadline holds across worker restarts and
does not depend on this worker having seen the run). The live worker's sweep calls
:meth:`ApprovalDeadlines.once` every few seconds; for each conversation waiting past
the deadline it submits the decision a client would: every pending call rejected with
the message "no decision within N s". The model hears the rejection and goes on.

It takes the same path as ``POST /api/chat`` with decisions: the submit script
claims the conversation atomically, so a client's decision and the deadline cannot
both be accepted (the loser is refused, or skipped here). What the two cannot rule
out, no more than two clients' decisions can, is a decision whose run has already
finished by the time the other is submitted: the worker, the only writer, finds the
interrupt answered and records that run ``failed`` with ``RUN_NOT_RESUMABLE``,
touching nothing of the thread. The conversation is read again just before the
submission to keep that window to a few milliseconds.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import structlog
from langgraph.graph.state import CompiledStateGraph
from redis.asyncio import Redis

from shared.contracts.codec import encode
from shared.contracts.jobs import Decision, DecisionAction, JobKind, RunJob
from shared.contracts.runs import RunStatus
from shared.redis.queue import submit
from shared.storage import Database
from shared.storage.schema import iso_from_timestamp
from shared.storage.threads.branch import thread_config
from shared.storage.threads.interrupts import interrupt_requests

log = structlog.get_logger(__name__)

#: Conversations looked at per pass: the rest wait for the next one.
BATCH = 50

_OVERDUE_SQL = (
    "SELECT c.id, c.title, r.id FROM runs r JOIN conversations c ON c.id = r.conversation_id"
    " WHERE r.status = ? AND c.last_run_id = r.id AND r.finished_at <= ?"
    " ORDER BY r.finished_at LIMIT ?"
)
_STILL_WAITING_SQL = (
    "SELECT 1 FROM conversations c JOIN runs r ON r.id = c.last_run_id"
    " WHERE c.id = ? AND r.id = ? AND r.status = ?"
)


def timeout_message(seconds: float) -> str:
    return f"no decision within {seconds:g} s"


class ApprovalDeadlines:
    def __init__(
        self, db: Database, graph: CompiledStateGraph[Any, Any, Any, Any], redis: Redis, timeout: float,
    ) -> None:
        self.db = db
        self.graph = graph
        self.redis = redis
        self.timeout = timeout

    async def once(self, now: float | None = None) -> int:
        """Reject the calls of every conversation waiting past the deadline; how many were submitted."""
        deadline = iso_from_timestamp((now if now is not None else time.time()) - self.timeout)
        db = self.db
        rows = await db.fetchall(_OVERDUE_SQL, (RunStatus.WAITING.value, deadline, BATCH))
        overdue = [(str(r[0]), str(r[1]), str(r[2])) for r in rows]
        submitted = 0
        for conversation_id, title, waiting_run in overdue:
            try:
                requests = await self._pending(conversation_id)
            except Exception as exc:  # a thread it cannot read costs only that conversation
                log.warning("approval.deadline_unreadable", conversation_id=conversation_id,
                            error=str(exc) or type(exc).__name__)
                continue
            if not requests:
                continue
            still = (conversation_id, waiting_run, RunStatus.WAITING.value)
            if not await db.fetchall(_STILL_WAITING_SQL, still):
                continue
            message = timeout_message(self.timeout)
            decisions = tuple(
                encode(Decision(id=str(r["id"]), action=DecisionAction.REJECT, message=message))
                for r in requests
            )
            job = RunJob(
                run_id=str(uuid.uuid4()), conversation_id=conversation_id, kind=JobKind.DECIDE,
                message=None, enqueued_at=time.time(), decisions=decisions,
            )
            holder = (await submit(self.redis, job, title=title)).holder
            if holder is not None:  # a client's decision (or a delete) holds it: theirs wins
                continue
            submitted += 1
            log.info(
                "approval.timed_out", conversation_id=conversation_id, run_id=job.run_id,
                waiting_run_id=waiting_run, calls=[d["id"] for d in decisions], timeout=self.timeout,
            )
        return submitted

    async def _pending(self, conversation_id: str) -> list[dict[str, Any]]:
        config = await thread_config(self.db.fetchall, conversation_id)
        state = await self.graph.aget_state(config)
        return interrupt_requests(state) or []
