"""What operators see of a run while it runs, and how they stop it.

One :class:`RunTracker` per run, driven by the run service at each step:

* ``progress_key(run)`` holds the current node and step (the API shows them with
  the elapsed time). Written with the events (:meth:`EventPublisher.along`), so
  it costs no round trip; deleted, the same way, when the run ends.
* Model call, tool call and checkpoint write latencies noted by
  :func:`worker.metrics.timed`, the run's wait in the queue and its time to first
  token travel in the same writes, at most once a second (``METRICS_EVERY_SECONDS``)
  and with the run's end: a run's nine checkpoint writes are then one increment of each
  bucket they fell in, not nine of three fields each. The run's :class:`RunClock` adds
  up its parts for the breakdown recorded with its outcome.

One :class:`CancelSignals` for the worker's life hears cancels: the API sets
``cancel_key(run)`` (the record, which start-up recovery reads after a crash) and
publishes the run's id on ``CANCEL_CHANNEL`` in the same transaction. The worker
is subscribed once, so a cancel reaches a run in a Redis round trip, without a
look per token or per step; the run service then cuts the run (worker/run/lifetime/stopping.py).
A run reads its marker once more before its first step, for a cancel asked
between being taken from the queue and being listed as in progress.

Nothing here fails the run: Redis is the view, the checkpoint is the truth. A
Redis outage hides progress and delays a cancel until Redis is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable
from types import TracebackType

import structlog
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError

from shared.redis.keys import CANCEL_CHANNEL, cancel_key, progress_key
from shared.redis.metrics import FIRST_TOKEN, QUEUE_WAIT, MetricBatch, queue_increments
from worker.metrics import RunClock
from worker.run.publish.events import EventPublisher
from worker.subscription import listen

log = structlog.get_logger(__name__)

#: a live run's progress must outlast any pause between steps
_PROGRESS_TTL_SECONDS = 24 * 3600
#: a run's latencies gathered in memory are written at most this often while it runs
METRICS_EVERY_SECONDS = 1.0


class RunTracker:
    """One run's progress and timings, from its start by the worker (its row recorded)."""

    def __init__(self, redis: Redis, run_id: str, enqueued_at: float | None = None) -> None:
        self.redis = redis
        self.run_id = run_id
        self.batch = MetricBatch()
        self.clock = RunClock()
        self.started_at = time.time()
        self._started = time.monotonic()
        self._first_token = False
        self._metrics_sent = self._started
        #: the publisher's failed writes when the progress key's expiry was last queued (None: never)
        self._expiry_queued_at: int | None = None
        #: steps started so far (the run's step count, whatever its outcome)
        self.steps = 0
        if enqueued_at is not None:
            self.batch.observe(QUEUE_WAIT, max(0.0, self.started_at - enqueued_at))

    def token(self) -> None:
        """A token is streamed: the run's first one is its time to first token."""
        if not self._first_token:
            self._first_token = True
            self.batch.observe(FIRST_TOKEN, time.monotonic() - self._started)

    async def cancel_requested(self) -> bool:
        """One round trip before the first step: pending metrics, the cancel marker."""
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                queue_increments(pipe, self.batch)
                pipe.exists(cancel_key(self.run_id))
                replies = await pipe.execute()
        except RedisError as exc:
            log.warning("run.progress_failed", error=str(exc))
            return False
        return bool(replies[-1])

    def step_started(self, step: int, node: str, events: EventPublisher) -> None:
        """Record the step; the write rides with the step's ``enter`` event."""
        self.steps = step
        updated_at = time.time()
        # The key's expiry is set with the run's first step, and again after a write of events
        # failed (it may have carried it): other steps only update the key (the run's end deletes
        # it; a day outlasts any pause between steps).
        first = self._expiry_queued_at != events.failed_writes
        self._expiry_queued_at = events.failed_writes

        def queue(pipe: Pipeline) -> None:
            key = progress_key(self.run_id)
            pipe.hset(key, mapping={
                "node": node, "step": step,
                "started_at": f"{self.started_at:.6f}", "updated_at": f"{updated_at:.6f}",
            })
            if first:
                pipe.expire(key, _PROGRESS_TTL_SECONDS)

        events.along(queue)

    def task_finished(self, events: EventPublisher) -> None:
        """The latencies gathered so far ride with the next events written (no round trip),
        if the last ones went a second ago or more; the run's end sends the rest."""
        now = time.monotonic()
        if now - self._metrics_sent >= METRICS_EVERY_SECONDS:
            self._metrics_sent = now
            events.along(lambda pipe: queue_increments(pipe, self.batch))

    def queue_close(self, pipe: Pipeline) -> None:
        """The run has its outcome: its last latencies; forget its progress and cancel marker.

        Queued on ``pipe`` (the run service hands it the pipeline of the events' last
        batch, so the progress key is deleted after every write that set it).
        """
        queue_increments(pipe, self.batch)
        pipe.delete(progress_key(self.run_id), cancel_key(self.run_id))


class CancelSignals:
    """Hears a cancel the moment the API asks for it, for the runs in progress.

    ``stop(run_id)`` is called for every run named on ``CANCEL_CHANNEL`` (the run
    service ignores runs it is not running); ``running()`` lists the runs in
    progress. Pub/sub keeps nothing for a subscriber that is away, so after every
    subscription, the first and each one after the connection was lost (a Redis
    restart), the markers of the runs in progress are read once: a cancel asked
    while the worker was not listening still lands, a round trip after it listens
    again. Used as an async context manager for the worker's life.
    """

    def __init__(
        self, redis: Redis, stop: Callable[[str], object], running: Callable[[], Iterable[str]]
    ) -> None:
        self.redis = redis
        self.stop = stop
        self.running = running
        #: subscriptions made so far (1 + reconnections)
        self.subscriptions = 0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> CancelSignals:
        self._task = asyncio.create_task(self._listen(), name="cancel-signals")
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _listen(self) -> None:
        await listen(self.redis, CANCEL_CHANNEL, subscribed=self._subscribed, heard=self.stop)

    async def _subscribed(self) -> None:
        self.subscriptions += 1
        log.info("cancels.listening", subscriptions=self.subscriptions)
        await self._sweep()

    async def _sweep(self) -> None:
        """Stop the runs in progress whose cancel was asked while no one was listening."""
        runs = list(self.running())
        if not runs:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for run_id in runs:
                pipe.exists(cancel_key(run_id))
            found = await pipe.execute()
        for run_id, asked in zip(runs, found, strict=True):
            if asked:
                self.stop(run_id)

