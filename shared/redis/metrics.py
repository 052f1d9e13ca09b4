"""Counters and histograms that live in Redis, so every API process can expose them.

The worker measures what happens inside runs (model calls, tool calls, run
durations, outcomes) but serves no HTTP; the API serves ``/metrics`` but sees
none of it. So the worker adds its observations to one Redis hash
(``METRICS_KEY``) with HINCRBY / HINCRBYFLOAT, and each API process turns the
hash into Prometheus families on every scrape. The figures are cumulative for
the life of the Redis data (AOF keeps them across restarts), which is what
Prometheus counters and histograms expect; a flushed Redis looks like a counter
reset, which Prometheus handles.

A histogram is stored as one field per bucket (the count of observations at or
below that bound and above the previous one), plus ``sum``; the reader makes the
buckets cumulative, and the count is their total (a ``count`` field written by an
older version is ignored: it always equalled that total).
"""

from __future__ import annotations

import bisect
import functools
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from redis.asyncio.client import Pipeline

METRICS_KEY = "sophos:metrics"

#: runs that reached an outcome, by status (counter)
RUNS_FINISHED = "sophos_runs_finished"
#: conversations deleted because they were idle past CONVERSATION_RETENTION_DAYS (counter)
CONVERSATIONS_EXPIRED = "sophos_conversations_expired"
#: crons' ticks by outcome (counter): ``fired`` (its run submitted) or ``skipped`` (the thread was
#: held by another run, waiting for a decision, or gone); worker/schedule/crons/ticks.py
CRON_TICKS = "sophos_cron_ticks"
CRON_TICK_OUTCOMES = ("fired", "skipped")
#: tool calls by outcome (counter): ``success``/``error`` (sent, and answered), ``answered``
#: (a later attempt answered from the ledger, not sent), ``not_repeated`` (it may have run, and
#: the user chose not to send it again); worker/tools/ledger/
TOOL_CALLS = "sophos_tool_calls"
TOOL_CALL_OUTCOMES = ("success", "error", "answered", "not_repeated")
#: tool calls sent again after a crash, by reason (counter): ``safe_to_repeat`` (its tool says so)
#: or ``decided`` (the user approved or edited it)
TOOL_CALLS_REPEATED = "sophos_tool_calls_repeated"
REPEAT_REASONS = ("safe_to_repeat", "decided")
#: tool calls made as MCP tasks that a resume answered from the task's result on its server, instead
#: of sending them again or asking (counter; worker/tools/ledger/, worker/tools/tasks.py)
TOOL_CALLS_FROM_TASK = "sophos_tool_calls_answered_from_task"
#: model calls a resume made again for a step whose model output, whole or in part, was lost
#: with the run that crashed before the step's writes were saved (counter; worker/agent/model_calls.py)
MODEL_CALLS_REPEATED = "sophos_model_calls_repeated"
#: attempts at delivering a run's webhook, by outcome (counter; worker/schedule/webhooks.py): ``delivered``,
#: ``retried`` (to be tried again) or ``failed`` (the last attempt failed)
WEBHOOK_DELIVERIES = "sophos_webhook_deliveries"
WEBHOOK_OUTCOMES = ("delivered", "retried", "failed")
#: seconds from a run's acceptance to its start by a worker (histogram)
QUEUE_WAIT = "sophos_queue_wait_seconds"
#: seconds from a run's start to its outcome, by status (histogram)
RUN_DURATION = "sophos_run_duration_seconds"
#: seconds from a run's start to its first streamed token (histogram)
FIRST_TOKEN = "sophos_time_to_first_token_seconds"  # noqa: S105 (a metric's name, not a secret)
#: seconds of one chat-model call, first byte to last (histogram)
MODEL_CALL = "sophos_model_call_duration_seconds"
#: seconds of one tool call, by tool (histogram)
TOOL_CALL = "sophos_tool_call_duration_seconds"
#: seconds of one checkpoint write: a step's checkpoint, or a task's writes (histogram)
CHECKPOINT_WRITE = "sophos_checkpoint_write_duration_seconds"

BUCKETS: dict[str, tuple[float, ...]] = {
    QUEUE_WAIT: (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800),
    RUN_DURATION: (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800),
    MODEL_CALL: (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
    TOOL_CALL: (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
    FIRST_TOKEN: (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
    CHECKPOINT_WRITE: (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5),
}

Labels = tuple[tuple[str, str], ...]


@functools.lru_cache(maxsize=4096)  # metrics, their labels' values and parts: a few hundred
def _field(metric: str, labels: Labels, part: str) -> str:
    return json.dumps([metric, dict(labels), part], separators=(",", ":"), sort_keys=True)


def _labels(labels: Mapping[str, str] | None) -> Labels:
    return tuple(sorted((labels or {}).items()))


def bound_label(value: float) -> str:
    return "+Inf" if math.isinf(value) else repr(float(value))


@dataclass(slots=True)
class MetricBatch:
    """Observations gathered in memory, written to Redis in one round trip by the caller."""

    counts: dict[str, int] = field(default_factory=dict)
    sums: dict[str, float] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.counts or self.sums)

    def inc(self, metric: str, labels: Mapping[str, str] | None = None, amount: int = 1) -> None:
        key = _field(metric, _labels(labels), "total")
        self.counts[key] = self.counts.get(key, 0) + amount

    def observe(self, metric: str, seconds: float, labels: Mapping[str, str] | None = None) -> None:
        bounds = BUCKETS[metric]
        i = bisect.bisect_left(bounds, seconds)
        bound = bounds[i] if i < len(bounds) else math.inf
        labs = _labels(labels)
        key = _field(metric, labs, f"le={bound_label(bound)}")
        self.counts[key] = self.counts.get(key, 0) + 1
        key = _field(metric, labs, "sum")
        self.sums[key] = self.sums.get(key, 0.0) + seconds

    def take(self) -> tuple[dict[str, int], dict[str, float]]:
        """The pending increments, leaving the batch empty."""
        counts, sums = self.counts, self.sums
        self.counts, self.sums = {}, {}
        return counts, sums


def counter_field(metric: str, **labels: str) -> str:
    """The hash field of a counter (for scripts that increment it themselves)."""
    return _field(metric, _labels(labels), "total")


def queue_increments(pipe: Pipeline, batch: MetricBatch) -> None:
    """Add the batch's pending increments to ``pipe`` (the caller executes it)."""
    counts, sums = batch.take()
    for key, count in counts.items():
        pipe.hincrby(METRICS_KEY, key, count)
    for key, total in sums.items():
        pipe.hincrbyfloat(METRICS_KEY, key, total)


@dataclass(frozen=True, slots=True)
class Histogram:
    labels: Labels
    #: (upper bound, cumulative count), ending with +Inf
    buckets: list[tuple[str, float]]
    sum: float


@dataclass(slots=True)
class MetricsSnapshot:
    """The hash as read back: counters and histograms by metric name and labels."""

    counters: dict[str, dict[Labels, float]] = field(default_factory=dict)
    histograms: dict[str, list[Histogram]] = field(default_factory=dict)

    def counter(self, metric: str, **labels: str) -> float:
        return self.counters.get(metric, {}).get(_labels(labels), 0.0)


def read_snapshot(raw: Mapping[str, str] | Iterable[tuple[str, str]]) -> MetricsSnapshot:
    """Parse ``HGETALL METRICS_KEY``; fields it does not understand are skipped."""
    items = raw.items() if isinstance(raw, Mapping) else raw
    counters: dict[str, dict[Labels, float]] = {}
    parts: dict[tuple[str, Labels], dict[str, float]] = {}
    for key, value in items:
        try:
            metric, labels, part = json.loads(key)
            number = float(value)
            labs = _labels({str(k): str(v) for k, v in labels.items()})
        except (ValueError, TypeError, AttributeError):
            continue
        if part == "total":
            counters.setdefault(metric, {})[labs] = number
        elif metric in BUCKETS:
            parts.setdefault((metric, labs), {})[part] = number
    snapshot = MetricsSnapshot(counters=counters)
    for (metric, labs), values in sorted(parts.items()):
        running = 0.0
        buckets = []
        for bound in BUCKETS[metric]:
            running += values.get(f"le={bound_label(bound)}", 0.0)
            buckets.append((bound_label(bound), running))
        buckets.append(("+Inf", running + values.get("le=+Inf", 0.0)))
        snapshot.histograms.setdefault(metric, []).append(
            Histogram(labels=labs, buckets=buckets, sum=values.get("sum", 0.0))
        )
    return snapshot
