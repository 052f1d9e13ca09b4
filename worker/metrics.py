"""Latencies of model and tool calls, noted where the calls are made.

The run service installs the run's :class:`MetricBatch` with :func:`collecting`
for the length of the run; the agent node and the MCP tool wrapper time their
calls with :func:`timed`. LangGraph runs each node in a task that copies the
context of the run, so the batch reaches them without being passed along. The
run service writes the batch to Redis at step boundaries and at the run's end,
so timing costs no round trip of its own (see shared/metrics.py).

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

from shared.metrics import MetricBatch

_batch: ContextVar[MetricBatch | None] = ContextVar("sophos_metric_batch", default=None)


@contextmanager
def collecting(batch: MetricBatch) -> Iterator[MetricBatch]:
    """Observations made by :func:`timed` in this context (and tasks it starts) go to ``batch``."""
    token = _batch.set(batch)
    try:
        yield batch
    finally:
        _batch.reset(token)


@contextmanager
def timed(metric: str, labels: Mapping[str, str] | None = None) -> Iterator[None]:
    """Observe the duration of the block, failed or not; nothing outside a run."""
    batch = _batch.get()
    started = time.monotonic()
    try:
        yield
    finally:
        if batch is not None:
            batch.observe(metric, time.monotonic() - started, labels)
