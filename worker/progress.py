"""What operators see of a run while it runs, and how they stop it.

One :class:`RunTracker` per run, driven by the run service at each step:

* ``progress_key(run)`` holds the current node and step (the API shows them with
  the elapsed time). Written with the events (:meth:`EventPublisher.along`), so
  it costs no round trip; deleted, the same way, when the run ends.
* ``cancel_key(run)``, set by the API's cancel route, is read before the first
  step and at the end of every task. Reading it there is what makes a cancel
  take effect at the *next* step boundary: LangGraph checks ``RunControl``
  between steps, after the task results are streamed.
* Model and tool call latencies noted by :func:`worker.metrics.timed` travel in
  the same round trips.

Nothing here fails the run: Redis is the view, the checkpoint is the truth. A
Redis outage hides progress and delays a cancel.
"""

from __future__ import annotations

import time

import structlog
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError

from shared.contracts import cancel_key, progress_key
from shared.metrics import RUN_DURATION, MetricBatch, queue_increments
from worker.events import EventPublisher

log = structlog.get_logger(__name__)

#: the drain reason that turns a drained run into a cancelled one
CANCEL_REASON = "cancel"
#: a live run's progress must outlast any pause between steps
_PROGRESS_TTL_SECONDS = 24 * 3600


class RunTracker:
    def __init__(self, redis: Redis, run_id: str) -> None:
        self.redis = redis
        self.run_id = run_id
        self.batch = MetricBatch()
        self.started_at = time.time()
        #: steps started so far (the run's step count, whatever its outcome)
        self.steps = 0

    async def _run(self) -> bool:
        """One round trip: pending metrics, the cancel marker."""
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                queue_increments(pipe, self.batch)
                pipe.exists(cancel_key(self.run_id))
                replies = await pipe.execute()
        except RedisError as exc:
            log.warning("run.progress_failed", error=str(exc))
            return False
        return bool(replies[-1])

    async def cancel_requested(self) -> bool:
        return await self._run()

    def step_started(self, step: int, node: str, events: EventPublisher) -> None:
        """Record the step; the write rides with the step's ``enter`` event.

        No cancel check here: one requested during the step is read when its task
        finishes, which is still before the next step boundary.
        """
        self.steps = step
        updated_at = time.time()

        def queue(pipe: Pipeline) -> None:
            key = progress_key(self.run_id)
            pipe.hset(key, mapping={
                "node": node, "step": step,
                "started_at": f"{self.started_at:.6f}", "updated_at": f"{updated_at:.6f}",
            })
            pipe.expire(key, _PROGRESS_TTL_SECONDS)

        events.along(queue)

    async def task_finished(self) -> bool:
        """Write the latencies gathered so far; True when a cancel has been requested."""
        return await self._run()

    def queue_close(self, pipe: Pipeline, duration: float | None) -> None:
        """The run has its outcome: note its duration, forget its progress and cancel marker.

        Queued on ``pipe`` (the run service hands it the pipeline of the events' last
        batch, so the progress key is deleted after every write that set it).
        """
        if duration is not None:
            self.batch.observe(RUN_DURATION, duration)
        queue_increments(pipe, self.batch)
        pipe.delete(progress_key(self.run_id), cancel_key(self.run_id))
