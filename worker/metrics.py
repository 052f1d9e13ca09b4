"""Latencies of model calls, tool calls and checkpoint writes, noted where the calls are made.

The run service installs the run's :class:`MetricBatch` and :class:`RunClock` with
:func:`collecting` for the length of the run; the agent node, the MCP tool wrapper and
the checkpointer (:class:`TimedCheckpoints`) time their calls with :func:`timed`.
LangGraph runs each node, and each task's checkpoint writes, in a task that copies the
context of the run, so the batch and the clock reach them without being passed along.
The run service writes the batch to Redis at step boundaries and at the run's end, so
timing costs no round trip of its own (see shared/redis/metrics.py); the clock's totals are
recorded with the run's outcome (its breakdown, shared/storage/rows.py).

Why not a LangChain callback handler: an async handler in a run's config is
awaited for every streamed token and every chain start and end, which cost the
worker about 5 ms of CPU per run in the benchmark (issue 6); two clock reads
around the call cost nothing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from shared.redis.metrics import CHECKPOINT_WRITE, MODEL_CALL, TOOL_CALL, MetricBatch
from shared.storage.rows import Breakdown

#: the part of a run's breakdown each timed call counts towards
PARTS = {MODEL_CALL: "model", TOOL_CALL: "tools", CHECKPOINT_WRITE: "database"}


class RunClock:
    """Wall time one run spends in each part (model, tools, database).

    Calls of one part that overlap (the tool calls of one step, made at once; a task's
    writes saved while another runs) count once: a part's time is how long at least one
    of its calls was in flight, so it never exceeds the run's duration.
    """

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PARTS.values(), 0.0)
        self._open = dict.fromkeys(PARTS.values(), 0)
        self._since = dict.fromkeys(PARTS.values(), 0.0)

    def enter(self, part: str, now: float) -> None:
        if self._open[part] == 0:
            self._since[part] = now
        self._open[part] += 1

    def leave(self, part: str, now: float) -> None:
        self._open[part] -= 1
        if self._open[part] == 0:
            self.seconds[part] += now - self._since[part]

    def breakdown(self, now: float | None = None) -> Breakdown:
        """The totals so far (a call still in flight, as at a cut, counts up to ``now``)."""
        now = time.monotonic() if now is None else now
        ms = {
            part: int(1000 * (total + (now - self._since[part] if self._open[part] else 0.0)))
            for part, total in self.seconds.items()
        }
        return Breakdown(model_ms=ms["model"], tools_ms=ms["tools"], database_ms=ms["database"])


_run: ContextVar[tuple[MetricBatch, RunClock | None] | None] = ContextVar("sophos_run_timing", default=None)


@contextmanager
def collecting(batch: MetricBatch, clock: RunClock | None = None) -> Iterator[MetricBatch]:
    """Observations made by :func:`timed` in this context (and tasks it starts) go to ``batch``,
    and the time of each part of the run to ``clock``."""
    token = _run.set((batch, clock))
    try:
        yield batch
    finally:
        _run.reset(token)


@contextmanager
def timed(metric: str, labels: Mapping[str, str] | None = None) -> Iterator[None]:
    """Observe the duration of the block, failed or not; nothing outside a run."""
    run = _run.get()
    if run is None:
        yield
        return
    batch, clock = run
    part = PARTS.get(metric, "")
    counted = clock if part else None
    started = time.monotonic()
    if counted is not None:
        counted.enter(part, started)
    try:
        yield
    finally:
        ended = time.monotonic()
        batch.observe(metric, ended - started, labels)
        if counted is not None:
            counted.leave(part, ended)


class TimedCheckpoints:
    """Mixed in before the saver's class (``open_checkpointer(hooks=...)``, shared/storage/engines.py):
    a run's checkpoint writes are timed, a step's checkpoint and a finished task's writes alike."""

    async def aput(self, *args: Any, **kwargs: Any) -> Any:
        with timed(CHECKPOINT_WRITE):
            return await super().aput(*args, **kwargs)  # type: ignore[misc]

    async def aput_writes(self, *args: Any, **kwargs: Any) -> Any:
        with timed(CHECKPOINT_WRITE):
            return await super().aput_writes(*args, **kwargs)  # type: ignore[misc]


def counted(metric: str, labels: Mapping[str, str] | None = None) -> None:
    """Count one occurrence of ``metric`` in the run's batch; nothing outside a run."""
    run = _run.get()
    if run is not None:
        run[0].inc(metric, labels)
