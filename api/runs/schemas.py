"""Bodies of the runs' routes: a run, the list, the worker.

JSON field names are camelCase except in the JSON Lines export, whose lines keep
the checkpointer's own snake_case names. Optional fields are left out, not null.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import UNSET, UnsetType

from shared.contracts.jobs import JobKind
from shared.contracts.runs import RunStatus


class RunError(msgspec.Struct):
    code: str
    message: str


def _ms(description: str) -> msgspec.Meta:
    return msgspec.Meta(ge=0, description=f"Milliseconds {description}")


class RunBreakdown(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    """Where a finished run spent its time, in milliseconds. ``modelMs``, ``toolsMs`` and
    ``databaseMs`` are within ``durationMs``: the wall time with a chat-model call, a tool call
    or a checkpoint write in flight (calls of one part made at once count once); the rest of the
    duration is the worker's own work (events, the outcome's write). ``queuedMs`` came before it."""

    queued_ms: Annotated[int, _ms("from its acceptance to its start by a worker (waitedMs)")] | UnsetType = (
        UNSET
    )
    model_ms: Annotated[int, _ms("with a chat-model call in flight")]
    tools_ms: Annotated[int, _ms("with a tool call in flight (a step's calls made at once count once)")]
    database_ms: Annotated[int, _ms("with a checkpoint write in flight (a step's, or a task's writes)")]


class RunInfo(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    id: str
    conversation: str
    kind: JobKind
    status: RunStatus
    enqueued_at: str | None
    started_at: str | None
    finished_at: str | None
    duration_ms: int | None
    step_count: int
    error: RunError | UnsetType = UNSET
    #: 0-based place among the queued runs, while queued
    position: int | UnsetType = UNSET
    #: time between enqueue and start (or now, while queued; or cancellation, if cancelled queued)
    waited_ms: int | UnsetType = UNSET
    #: while running: the node of the current step and the time since the run started
    node: str | UnsetType = UNSET
    elapsed_ms: int | UnsetType = UNSET
    #: a cancel was asked for and the worker has not stopped the run yet
    cancel_requested: bool | UnsetType = UNSET
    #: once finished, where its time went (absent for a run no worker timed: one ended by
    #: recovery after a crash, or one from before this field)
    breakdown: Annotated[RunBreakdown, msgspec.Meta(description=(
        "Once finished, where its time went; absent for a run no worker timed (ended by recovery "
        "after a crash, or recorded before this field)"
    ))] | UnsetType = UNSET
    #: whose run it is (its conversation's owner), who started it and who cancelled it
    owner: str | UnsetType = UNSET
    started_by: str | UnsetType = UNSET
    cancelled_by: str | UnsetType = UNSET


class WorkerInfo(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    """The workers as their heartbeats tell it: alive or not, how many, and of the newest
    beat (else the last one seen) since when and last seen when."""

    alive: bool
    pid: int | UnsetType = UNSET
    #: when the live worker (or the last one seen) started
    started_at: str | UnsetType = UNSET
    last_beat_at: str | UnsetType = UNSET
    heartbeat_age_ms: int | UnsetType = UNSET
    #: runs it executes at once (``WORKER_CONCURRENCY``)
    concurrency: int | UnsetType = UNSET
    #: live workers (the other fields tell of the newest beat among them)
    count: int | UnsetType = UNSET


class RunList(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    runs: list[RunInfo]
    #: pass as ``cursor`` for the next (older) page; absent on the last page
    next_cursor: str | UnsetType = UNSET
    #: absent when Redis cannot be asked
    worker: WorkerInfo | UnsetType = UNSET
