"""``GET /metrics``: Prometheus text format, built afresh from Redis and SQLite on each scrape.

What every API process agrees on comes from shared state, read at scrape time:

* queue figures from the index of queued runs the Redis scripts keep (two ZCARDs: a scrape
  costs the same at any queue length, api/runs/queue.py);
* running runs from the ``runs`` table (one count through its status index), and the
  conversations waiting for an approval decision;
* counters and histograms the worker keeps in Redis (shared/redis/metrics.py): runs
  finished by status, queue wait, run duration by status, time to first token,
  model-call, tool-call and checkpoint-write latency;
* the worker's heartbeat (with the outcomes each live worker still keeps for a retry).

What only this process knows (its open event streams, and prometheus-client's
process and Python collectors) comes from the process's default registry.
A source that cannot be read is left out of the scrape and ``sophos_redis_up``
/ ``sophos_database_up`` say so, rather than reporting zeros that are not true.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import structlog
from prometheus_client import REGISTRY, CollectorRegistry, Gauge, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from redis.exceptions import RedisError

from api.resources import Resources
from api.runs import queue
from shared.contracts.runs import RunStatus
from shared.errors import SophosError
from shared.redis.liveness import Liveness, read_liveness
from shared.redis.metrics import (
    BUCKETS,
    CHECKPOINT_WRITE,
    CONVERSATIONS_EXPIRED,
    CRON_TICK_OUTCOMES,
    CRON_TICKS,
    FIRST_TOKEN,
    METRICS_KEY,
    MODEL_CALL,
    MODEL_CALLS_REPEATED,
    QUEUE_WAIT,
    REPEAT_REASONS,
    RUN_DURATION,
    RUNS_FINISHED,
    TOOL_CALL,
    TOOL_CALL_OUTCOMES,
    TOOL_CALLS,
    TOOL_CALLS_FROM_TASK,
    TOOL_CALLS_REPEATED,
    WEBHOOK_DELIVERIES,
    WEBHOOK_OUTCOMES,
    MetricsSnapshot,
    bound_label,
    read_snapshot,
)

log = structlog.get_logger(__name__)

T = TypeVar("T")

SSE_SUBSCRIBERS = Gauge(
    "sophos_sse_subscribers", "Event streams (GET /api/chat) this API process is serving now"
)


async def counted(events: AsyncIterator[T]) -> AsyncIterator[T]:
    """``events``, counted in ``sophos_sse_subscribers`` while the client is connected."""
    SSE_SUBSCRIBERS.inc()
    try:
        # aclosing: a client that goes away closes the inner stream at once, not at GC.
        async with contextlib.aclosing(events) as inner:  # type: ignore[type-var]
            async for event in inner:
                yield event
    finally:
        SSE_SUBSCRIBERS.dec()


_HELP = {
    RUNS_FINISHED: "Runs that reached an outcome, by status (queued runs cancelled included)",
    QUEUE_WAIT: "Seconds from a run's acceptance to its start by a worker",
    RUN_DURATION: "Seconds from a run's start by the worker to its outcome, by status",
    FIRST_TOKEN: "Seconds from a run's start by the worker to its first streamed token",
    MODEL_CALL: "Seconds of one chat-model call, request to last token",
    TOOL_CALL: "Seconds of one tool call, by tool",
    CHECKPOINT_WRITE: "Seconds of one checkpoint write of a run (a step's checkpoint, or a task's writes)",
}

#: the worker's histograms and their labels; one without labels is shown (empty) before any observation
_HISTOGRAMS: tuple[tuple[str, list[str]], ...] = (
    (QUEUE_WAIT, []), (RUN_DURATION, ["status"]), (FIRST_TOKEN, []), (MODEL_CALL, []),
    (TOOL_CALL, ["tool"]), (CHECKPOINT_WRITE, []),
)


@dataclass(slots=True)
class Figures:
    """One scrape's reading of shared state; None where a source could not be read."""

    #: the queue: runs queued, those waiting behind their thread, the oldest of the others
    queue: queue.Figures | None = None
    snapshot: MetricsSnapshot | None = None
    liveness: Liveness | None = None
    #: runs recorded running (one indexed count: a scrape costs the same at any table size)
    running: int | None = None
    #: conversations waiting for an approval decision
    waiting: int | None = None
    now: float = 0.0


async def gather(resources: Resources) -> Figures:
    figures = Figures(now=time.time())
    try:
        figures.snapshot = read_snapshot(await resources.redis.hgetall(METRICS_KEY))  # type: ignore[misc]
        figures.liveness = await read_liveness(resources.redis)
        figures.queue = await queue.figures(resources.redis)
    except (RedisError, OSError, SophosError) as exc:
        log.warning("metrics.source_unavailable", error=str(exc))
    try:
        figures.running = await resources.store.running_count()
        figures.waiting = await resources.store.waiting_count()
    except SophosError as exc:
        log.warning("metrics.source_unavailable", error=exc.message)
    return figures


def _by_label(
    snapshot: MetricsSnapshot, metric: str, help_text: str, label: str, values: Iterable[str]
) -> CounterMetricFamily:
    """A counter of the snapshot with one label, a sample for each of ``values`` (0 included)."""
    family = CounterMetricFamily(metric, help_text, labels=[label])
    for value in values:
        family.add_metric([value], snapshot.counter(metric, **{label: value}))
    return family


class SharedStateCollector:
    """Turns one :class:`Figures` into metric families (prometheus-client calls ``collect``)."""

    def __init__(self, figures: Figures) -> None:
        self.figures = figures

    def collect(self) -> Iterator[Metric]:
        f = self.figures
        yield _gauge("sophos_redis_up", "1 when this scrape could read Redis", f.snapshot is not None)
        yield _gauge("sophos_database_up", "1 when this scrape read the database", f.running is not None)
        if f.queue is not None:
            yield _gauge("sophos_runs_queued", "Runs in the queue, not started", f.queue.queued)
            yield _gauge(
                "sophos_runs_waiting_for_thread",
                "Queued runs waiting behind another run of their conversation (multitask_strategy enqueue)",
                f.queue.behind,
            )
            # The backlog's age: a run waiting for its thread waits however free the worker is.
            oldest = f.queue.oldest_enqueued_at
            yield _gauge(
                "sophos_queue_oldest_age_seconds",
                "How long the oldest queued run has waited (0: none); runs waiting behind their thread's "
                "run are not counted",
                max(0, round((f.now - oldest) * 1000)) / 1000 if oldest else 0,
            )
        if f.running is not None:
            yield _gauge("sophos_runs_running", "Runs recorded as running", f.running)
        if f.waiting is not None:
            yield _gauge(
                "sophos_conversations_waiting", "Conversations waiting for a decision on a tool call",
                f.waiting,
            )
        if f.snapshot is not None:
            yield from self._worker_side(f.snapshot)
        if f.liveness is not None:
            yield from self._worker(f.liveness)

    def _worker_side(self, snapshot: MetricsSnapshot) -> Iterator[Metric]:
        finished = CounterMetricFamily(RUNS_FINISHED, _HELP[RUNS_FINISHED], labels=["status"])
        for status in RunStatus:
            if status.finished:
                finished.add_metric([status.value], snapshot.counter(RUNS_FINISHED, status=status.value))
        yield finished
        yield _by_label(
            snapshot, TOOL_CALLS,
            "Tool calls by outcome: sent and answered (success, error), answered from the ledger on a"
            " later attempt (answered), or not sent again by the user's choice (not_repeated)",
            "outcome", TOOL_CALL_OUTCOMES,
        )
        yield _by_label(
            snapshot, TOOL_CALLS_REPEATED, "Tool calls that may have run sent again after a crash, by reason",
            "reason", REPEAT_REASONS,
        )
        yield CounterMetricFamily(
            TOOL_CALLS_FROM_TASK,
            "Tool calls made as MCP tasks that a resume after a crash answered from the task's result on"
            " its server, instead of sending them again or asking",
            value=snapshot.counter(TOOL_CALLS_FROM_TASK),
        )
        yield CounterMetricFamily(
            MODEL_CALLS_REPEATED,
            "Model calls a resume made again: the run that crashed had started the same step's call,"
            " and its output was lost before the step's writes were saved",
            value=snapshot.counter(MODEL_CALLS_REPEATED),
        )
        yield CounterMetricFamily(
            CONVERSATIONS_EXPIRED,
            "Conversations deleted because they were idle past CONVERSATION_RETENTION_DAYS",
            value=snapshot.counter(CONVERSATIONS_EXPIRED),
        )
        yield _by_label(
            snapshot, WEBHOOK_DELIVERIES, "Attempts at delivering a run's webhook, by outcome: delivered,"
            " retried (to be tried again) or failed (the last attempt failed)", "outcome", WEBHOOK_OUTCOMES,
        )
        yield _by_label(
            snapshot, CRON_TICKS,
            "Ticks of crons, by outcome: fired (a run submitted) or skipped (thread busy)",
            "outcome", CRON_TICK_OUTCOMES,
        )
        for metric, labels in _HISTOGRAMS:
            family = HistogramMetricFamily(metric, _HELP[metric], labels=labels)
            histograms = snapshot.histograms.get(metric, [])
            for h in histograms:
                values = dict(h.labels)
                family.add_metric([values.get(name, "") for name in labels], h.buckets, h.sum)
            if not histograms and not labels:
                family.add_metric([], [(bound_label(b), 0.0) for b in BUCKETS[metric]] + [("+Inf", 0.0)], 0.0)
            yield family

    def _worker(self, liveness: Liveness) -> Iterator[Metric]:
        yield _gauge("sophos_worker_up", "1 while a worker's heartbeat is fresh", liveness.alive)
        yield _gauge("sophos_workers", "Workers whose heartbeat is fresh", liveness.count)
        yield _gauge(
            "sophos_outcomes_deferred",
            "Run outcomes the database refused, kept by the live workers for a retry",
            sum(beat.deferred_outcomes for beat in liveness.workers),
        )
        if liveness.beat is not None:
            yield _gauge(
                "sophos_worker_heartbeat_age_seconds",
                "Seconds since the worker's last heartbeat (it beats every 2 s)",
                liveness.age(self.figures.now) or 0.0,
            )
            yield _gauge(
                "sophos_worker_start_time_seconds", "When the live (or last seen) worker started, Unix time",
                liveness.beat.started_at,
            )


def _gauge(name: str, documentation: str, value: float | bool) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=float(value))


class _ThisProcess:
    """The default registry's collectors (this process's own metrics), inside a per-scrape registry."""

    def collect(self) -> Iterator[Metric]:
        yield from REGISTRY.collect()


async def render(resources: Resources) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SharedStateCollector(await gather(resources)))
    registry.register(_ThisProcess())
    return generate_latest(registry)
