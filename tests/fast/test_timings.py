"""A run's timings without a process: its clock, its breakdown's record, the histograms' families."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from msgspec import UNSET

from api.ops.metrics import Figures, SharedStateCollector
from api.runs.views import from_row
from shared.redis.metrics import (
    CHECKPOINT_WRITE,
    MODEL_CALL,
    RUN_DURATION,
    TOOL_CALL,
    MetricBatch,
    read_snapshot,
)
from shared.storage.rows import Breakdown, RunRow
from worker.metrics import RunClock, TimedCheckpoints, collecting, timed


def test_calls_of_one_part_that_overlap_count_once() -> None:
    clock = RunClock()
    clock.enter("tools", 10.0)
    clock.enter("tools", 10.5)  # a second call of the same step, made at once
    clock.leave("tools", 11.0)
    clock.leave("tools", 12.0)
    clock.enter("model", 12.0)
    clock.leave("model", 12.25)
    clock.enter("database", 13.0)  # still in flight: counts up to now
    assert clock.breakdown(now=13.5) == Breakdown(model_ms=250, tools_ms=2000, database_ms=500)


async def test_timed_calls_go_to_the_runs_batch_and_clock_and_tasks_inherit_them() -> None:
    class Saver:
        async def aput(self, *args: object) -> str:
            await asyncio.sleep(0.01)
            return "put"

        async def aput_writes(self, *args: object) -> None:
            await asyncio.sleep(0.01)

    saver = type("TimedSaver", (TimedCheckpoints, Saver), {})()
    batch, clock = MetricBatch(), RunClock()

    async def step() -> None:
        with timed(MODEL_CALL):
            await asyncio.sleep(0.02)
        assert await saver.aput("config") == "put"
        with timed(TOOL_CALL, {"tool": "tools__add"}):
            await asyncio.sleep(0.01)

    with collecting(batch, clock):
        task = asyncio.create_task(step())  # copies the context, as LangGraph's tasks do
    await task
    await saver.aput_writes("outside a run")  # not the run's: not counted
    snapshot = read_snapshot(_fields(batch))
    counts = {metric: sum(h.buckets[-1][1] for h in hs) for metric, hs in snapshot.histograms.items()}
    assert counts == {MODEL_CALL: 1, CHECKPOINT_WRITE: 1, TOOL_CALL: 1}
    parts = clock.breakdown()
    assert parts.model_ms >= 20 and parts.tools_ms >= 10 and parts.database_ms >= 10


def _fields(batch: MetricBatch) -> list[tuple[str, str]]:
    counts, sums = batch.take()
    return [(k, str(v)) for k, v in counts.items()] + [(k, str(v)) for k, v in sums.items()]


def test_the_breakdown_column_reads_back_and_ignores_what_it_does_not_know() -> None:
    parts = Breakdown(model_ms=1200, tools_ms=300, database_ms=4)
    assert Breakdown.from_json(parts.to_json()) == parts
    assert Breakdown.from_json(None) is None and Breakdown.from_json('{"model": 1}') is None


def test_a_finished_runs_breakdown_adds_its_wait_in_the_queue() -> None:
    row = RunRow(
        id="r", conversation_id="c", kind="run", status="completed", error_code=None, error_message=None,
        enqueued_at="2026-01-01T00:00:00.000Z", started_at="2026-01-01T00:00:00.250Z",
        finished_at="2026-01-01T00:00:02.000Z", step_count=3,
        breakdown=Breakdown(model_ms=1200, tools_ms=300, database_ms=4),
    )
    info = from_row(row)
    assert info.breakdown and (info.breakdown.queued_ms, info.breakdown.model_ms) == (250, 1200)
    assert from_row(replace(row, breakdown=None)).breakdown is UNSET  # left out of the answer


def test_run_duration_is_by_status_and_the_unlabelled_histograms_show_before_any_run() -> None:
    batch = MetricBatch()
    batch.observe(RUN_DURATION, 1.5, {"status": "completed"})
    batch.observe(RUN_DURATION, 0.2, {"status": "failed"})
    figures = Figures(snapshot=read_snapshot(_fields(batch)))
    families = {f.name: f for f in SharedStateCollector(figures).collect()}
    counts = {
        s.labels["status"]: s.value for s in families["sophos_run_duration_seconds"].samples
        if s.name.endswith("_count")
    }
    assert counts == {"completed": 1, "failed": 1}
    for name in (
        "sophos_queue_wait_seconds", "sophos_time_to_first_token_seconds",
        "sophos_checkpoint_write_duration_seconds", "sophos_model_call_duration_seconds",
    ):
        samples = {s.name: s.value for s in families[name].samples if "le" not in s.labels}
        assert samples == {f"{name}_count": 0, f"{name}_sum": 0}, name


def test_observations_write_one_field_a_bucket_and_the_count_is_the_buckets_total() -> None:
    batch = MetricBatch()
    for seconds in (0.0004, 0.0004, 0.003, 7.0):  # two in the first bucket, one in a later, one past all
        batch.observe(CHECKPOINT_WRITE, seconds)
    fields = _fields(batch)
    assert len(fields) == 4  # three buckets and the sum: no count field to keep in step
    # A count an older version wrote beside the buckets is not read: the buckets say it.
    stale = [(f'["{CHECKPOINT_WRITE}",{{}},"count"]', "99")]
    (histogram,) = read_snapshot(fields + stale).histograms[CHECKPOINT_WRITE]
    cumulative = dict(histogram.buckets)
    assert cumulative["0.001"] == 2 and cumulative["0.005"] == 3 and cumulative["5.0"] == 3
    assert cumulative["+Inf"] == 4
    assert abs(histogram.sum - 7.0038) < 1e-9
