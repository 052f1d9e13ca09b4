"""Every reach of the worker into arq's private names (the other libraries': shared/compat.py).

Each one here, and nowhere else, with the version it was read from; tests/fast/test_compat.py
fails when an installed library no longer has what is used, or (for the arq code copied here)
when the source it was copied from changed. Whoever upgrades one of these libraries reads its
new code where that test points, brings the copy in line, and updates the version and hashes.
"""

from __future__ import annotations

from arq.connections import ArqRedis
from arq.worker import Worker

#: the versions each use below was read from (the lock pins them: requirements.lock; arq is
#: pinned exactly in pyproject.toml too, for the copy of its ``start_jobs``)
READ_FROM = {
    "arq": "0.28.0",
}


# --- arq 0.28.0: its worker's loop (worker/queue/wakeup.py) ----------------------------------------------


class HookedWorker(Worker):
    """arq's ``Worker`` with two hooks into its private loop, and its pool made settable.

    - :meth:`take` replaces how ``start_jobs`` takes a due job: arq's WATCH, EXISTS, ZSCORE
      and MULTI/EXEC. The rest of ``start_jobs`` below is arq 0.28.0's own, copied (it has no
      hook): the semaphore, the job counter, the job's task and its done-callback.
    - :meth:`order` chooses the order in which ``start_jobs`` tries the due jobs arq read
      (arq's own: queue order).
    - :meth:`after_poll` runs after each ``_poll_iteration`` (arq's look at the queue, which
      calls ``start_jobs``), instead of arq's own ``poll_delay`` sleep (set it to 0).
    """

    async def take(self, job_id: str) -> float | None:
        """Mark ``job_id`` in progress if it is due and not taken; its queue score, or None."""
        raise NotImplementedError

    async def order(self, job_ids: list[bytes]) -> list[bytes]:
        """The due jobs ``job_ids`` (queue order) in the order to try to take them."""
        return job_ids

    async def after_poll(self) -> None:
        """What the worker does between two looks at its queue."""

    @property
    def own_pool(self) -> ArqRedis | None:
        """The Redis pool the worker has (arq's ``_pool``): None until ``main`` makes one."""
        return self._pool

    @own_pool.setter
    def own_pool(self, pool: ArqRedis) -> None:
        self._pool = pool

    async def start_jobs(self, job_ids: list[bytes]) -> None:
        """arq's ``start_jobs``, the jobs in :meth:`order`, each taken by :meth:`take`."""
        for job_id_b in await self.order(job_ids):
            await self.sem.acquire()
            if self.job_counter >= self.max_jobs:
                self.sem.release()
                return
            self.job_counter += 1
            job_id = job_id_b.decode()
            try:
                score = await self.take(job_id)
            except BaseException:
                self.job_counter -= 1
                self.sem.release()
                raise
            if score is None:
                # Taken elsewhere, gone from the queue, or not due yet (arq's own reasons).
                self.job_counter -= 1
                self.sem.release()
                continue
            task = self.loop.create_task(self.run_job(job_id, int(score)))
            task.add_done_callback(lambda _: self._release_sem_dec_counter_on_complete())
            self.tasks[job_id] = task

    async def _poll_iteration(self) -> None:
        await super()._poll_iteration()
        await self.after_poll()

