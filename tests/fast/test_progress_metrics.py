"""When a run's latencies leave the worker (worker/run/publish/progress.py): with a task's end a second or
more after the last ones went, and with the run's end; never once per task."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from shared.redis.metrics import CHECKPOINT_WRITE
from worker.run.publish import progress
from worker.run.publish.events import EventPublisher
from worker.run.publish.progress import METRICS_EVERY_SECONDS, RunTracker

pytestmark = pytest.mark.fast


async def test_a_runs_latencies_ride_with_a_task_end_at_most_once_a_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1000.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    redis = Redis()  # never connected: nothing here writes
    events = EventPublisher(redis, "run", retention=60, max_len=100, new_stream=True)
    tracker = RunTracker(redis, "run")
    for _ in range(9):  # a run's checkpoint writes and task ends, within its first second
        tracker.batch.observe(CHECKPOINT_WRITE, 0.002)
        now[0] += 0.05
        tracker.task_finished(events)
    assert events._along == []  # nothing sent yet: one write at the end carries all nine
    now[0] += METRICS_EVERY_SECONDS
    tracker.task_finished(events)
    assert len(events._along) == 1  # a long run's latencies do not wait for its end
    tracker.task_finished(events)
    assert len(events._along) == 1
    await redis.aclose()
