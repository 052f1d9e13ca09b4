"""Rows of the application tables as both sides read them, and the title a conversation gets.

The worker writes these tables and the API reads them (shared/storage/schema.py creates them); one
definition keeps the two readings, and the title the API shows for a queued conversation and the
one the worker records, the same.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: The runs table's columns in :class:`RunRow`'s order: ``SELECT {RUN_COLUMNS} FROM runs``.
RUN_COLUMNS = (
    "id, conversation_id, kind, status, error_code, error_message, enqueued_at, started_at,"
    " finished_at, step_count, breakdown, owner, started_by, cancelled_by"
)

TITLE_CHARS = 80


@dataclass(frozen=True, slots=True)
class RunRow:
    id: str
    conversation_id: str
    kind: str
    status: str
    error_code: str | None
    error_message: str | None
    enqueued_at: str | None
    started_at: str | None
    finished_at: str | None
    step_count: int
    #: where the run spent its time, when the worker that ended it timed it
    breakdown: Breakdown | None = None
    #: whose it is (its conversation's owner), who started it, who cancelled it
    owner: str = "local"
    started_by: str | None = None
    cancelled_by: str | None = None

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> RunRow:
        """A row selected with :data:`RUN_COLUMNS`."""
        return cls(
            id=row[0], conversation_id=row[1], kind=row[2], status=row[3], error_code=row[4],
            error_message=row[5], enqueued_at=row[6], started_at=row[7], finished_at=row[8],
            step_count=int(row[9] or 0), breakdown=Breakdown.from_json(row[10]), owner=row[11],
            started_by=row[12], cancelled_by=row[13],
        )


@dataclass(frozen=True, slots=True)
class Breakdown:
    """Where a run spent its time between its start and its outcome, in whole milliseconds:
    wall time with a chat-model call, a tool call or a checkpoint write in flight (calls of one
    part that overlap, a step's tool calls made at once, count once). Recorded with the outcome
    (the ``breakdown`` column, JSON; worker/metrics.py measures it)."""

    model_ms: int
    tools_ms: int
    database_ms: int

    def to_json(self) -> str:
        parts = {"model_ms": self.model_ms, "tools_ms": self.tools_ms, "database_ms": self.database_ms}
        return json.dumps(parts)

    @classmethod
    def from_json(cls, raw: str | None) -> Breakdown | None:
        """The column's value; None when absent or not one this code wrote."""
        if not raw:
            return None
        try:
            parts = json.loads(raw)
            return cls(int(parts["model_ms"]), int(parts["tools_ms"]), int(parts["database_ms"]))
        except (ValueError, TypeError, KeyError):
            return None


def title_of(message: str | None) -> str:
    """A conversation's title: the first line of its first message, at most 80 characters."""
    stripped = (message or "").strip()
    return stripped.splitlines()[0][:TITLE_CHARS] if stripped else "New conversation"
