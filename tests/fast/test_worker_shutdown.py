"""The worker's stop: a job that ends cancelled does not keep the resources from closing
(worker/__main__.py ``_jobs_ended``, before arq's ``close``)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

import pytest

from worker.__main__ import _jobs_ended


def test_a_job_cut_twice_that_ends_cancelled_is_waited_for_and_forgotten() -> None:
    async def scenario() -> None:
        async def job() -> None:
            try:
                await asyncio.sleep(60)
            finally:
                await asyncio.sleep(0)  # what a step does while it is cut: it still ends cancelled

        cut = asyncio.create_task(job())
        running = asyncio.create_task(asyncio.sleep(60))
        done = asyncio.create_task(asyncio.sleep(0))
        await asyncio.sleep(0.01)
        cut.cancel()
        worker = SimpleNamespace(tasks={"cut": cut, "running": running, "done": done})
        await _jobs_ended(cast(Any, worker))
        assert cut.cancelled() and running.cancelled() and done.done() and not done.cancelled()
        assert worker.tasks == {}
        # What arq's close does with them (a gather that lets the first cancellation out): raised.
        with pytest.raises(asyncio.CancelledError):
            await asyncio.gather(cut, done)

    asyncio.run(scenario())
