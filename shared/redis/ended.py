"""Whether a run ended, and how: the one reader of a recorded ending, row or no row.

A run the worker started has a row, and the row is its record. A run that ended without one
never reached a worker, or reached it and was refused before it could be recorded: cancelled
while queued (api/runs/cancel.py), dropped by the sweep, refused by the database or at its
turn (worker/run/outcome/ending.py with ``recorded=False``). Its ending is only in Redis, written by
the same scripts that publish it (shared/redis/scripts/): its ``run_key`` description,
marked with the status (``cancelled_at`` or ``failed_at`` beside it), kept
``ENDED_RECORD_SECONDS``; and the terminal event of its stream, kept ``EVENT_RETENTION``.

:func:`recorded` reads them in that order, the row first, and answers a :class:`Recorded`:
what the relay, the runs routes, the cancel and the webhooks all ask. A run without a row
is given as the row its record amounts to (no start, no steps), so every reader shapes
both alike. None means nothing at all is known of the run any more.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from shared.contracts.events import EventType
from shared.contracts.runs import RunStatus
from shared.redis.keys import events_key, run_key
from shared.storage.rows import RunRow
from shared.storage.schema import iso_from_timestamp

#: How a caller reads a run's row (the API's ``Store.run``, the worker's ``RunStore.get_run``).
ReadRow = Callable[[str], Awaitable[RunRow | None]]

_TERMINAL = frozenset({EventType.END.value, EventType.CHAT_ERROR.value})
#: the description's fields that say when a run without a row ended (whichever its writer set)
_ENDED_AT = ("cancelled_at", "failed_at")


@dataclass(frozen=True, slots=True)
class Recorded:
    """What is recorded of a run: its row, or the row its Redis record amounts to."""

    row: RunRow
    #: True: the database's row; False: rebuilt from what Redis recorded (the run has no row)
    stored: bool

    @property
    def status(self) -> RunStatus:
        return status_of(self.row.status) or RunStatus.COMPLETED

    @property
    def ended(self) -> bool:
        return self.status.finished

    @property
    def code(self) -> str | None:
        return self.row.error_code


def status_of(value: str | None) -> RunStatus | None:
    try:
        return RunStatus(value) if value else None
    except ValueError:
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _seconds(raw: str | None) -> float | None:
    try:
        return float(raw) if raw else None
    except ValueError:
        return None


def _iso(raw: str | None) -> str | None:
    at = _seconds(raw)
    return iso_from_timestamp(at) if at else None


def from_description(run_id: str, fields: Mapping[Any, Any]) -> RunRow | None:
    """The run as its ``run_key`` description records it: ``queued`` while it holds no ending,
    else the ending. None for a description without its conversation (not one this code wrote)."""
    text = {_text(k): _text(v) for k, v in fields.items()}
    conversation = text.get("conversation")
    if not conversation:
        return None
    status = status_of(text.get("status"))
    ended = status is not None and status.finished
    return RunRow(
        id=run_id, conversation_id=conversation, kind=text.get("kind") or "run",
        status=(status if ended and status is not None else RunStatus.QUEUED).value,
        error_code=(text.get("error_code") or None) if ended else None,
        error_message=(text.get("error_message") or None) if ended else None,
        enqueued_at=_iso(text.get("enqueued_at")), started_at=None,
        finished_at=next((_iso(text.get(f)) for f in _ENDED_AT if text.get(f)), None) if ended else None,
        step_count=0, owner=text.get("owner") or "local", started_by=text.get("started_by") or None,
        cancelled_by=(text.get("cancelled_by") or None) if ended else None,
    )


def from_terminal_event(run_id: str, fields: Mapping[Any, Any], enqueued_at: str | None) -> RunRow | None:
    """The run's ending as the terminal event of its stream says it (``fields``: the entry's),
    None when the entry is not a terminal event."""
    text = {_text(k): _text(v) for k, v in fields.items()}
    if text.get("type") not in _TERMINAL:
        return None
    try:
        body = json.loads(text.get("data") or "")
    except ValueError:
        return None
    status = status_of(body.get("status")) if isinstance(body, dict) else None
    if status is None or not status.finished or not body.get("conversation"):
        return None
    return RunRow(
        id=run_id, conversation_id=str(body["conversation"]), kind="run", status=status.value,
        error_code=body.get("code") or None, error_message=body.get("message") or None,
        enqueued_at=enqueued_at, started_at=None, finished_at=None, step_count=0,
        owner="",  # the event does not say whose: an operator's to see
    )


async def recorded(redis: Redis, run_id: str, read_row: ReadRow) -> Recorded | None:
    """What is recorded of ``run_id``: its row, else what Redis recorded, else None (unknown).

    Without a row, one round trip reads both Redis records: the description (which also says
    a run is still ``queued``), and the stream's last entry, the ending alone where the
    description is gone. When Redis says the run ended, the row is read once more (a run can
    start and end between the first read and Redis's). Database and Redis errors are the
    caller's to handle.
    """
    row = await read_row(run_id)
    if row is not None:
        return Recorded(row, stored=True)
    found = await _in_redis(redis, run_id)
    if found is not None and found.ended:
        # The run may have been taken, run and ended between the two reads: its terminal event
        # is in Redis, and its row, written before it (persist, then notify), now in the
        # database. Read once more, so such a run is never taken for one that ended without a
        # row, ended at no known time (a relay would take its stream as expired). A row still
        # missing now is missing for good.
        row = await read_row(run_id)
        if row is not None:
            return Recorded(row, stored=True)
    return found


async def _in_redis(redis: Redis, run_id: str) -> Recorded | None:
    """What Redis records of ``run_id``, a run without a row."""
    async with redis.pipeline(transaction=False) as pipe:
        pipe.hgetall(run_key(run_id))
        pipe.xrevrange(events_key(run_id), count=1)
        fields, newest = await pipe.execute()
    described = from_description(run_id, fields) if fields else None
    if described is not None and status_of(described.status) is not RunStatus.QUEUED:
        return Recorded(described, stored=False)
    if newest:
        # Ended, and the description does not say so (it expired, or was never written: the
        # worker could not reach Redis then; or the worker ran the run, whose row is its
        # record, and the caller's read of it came before the row was written): the terminal
        # event is the record.
        ending = from_terminal_event(run_id, newest[0][1], described.enqueued_at if described else None)
        if ending is not None:
            return Recorded(ending, stored=False)
    return Recorded(described, stored=False) if described is not None else None
