"""Outcomes the database refused to record, written as soon as it takes writes again.

A run ends while the database is locked past its busy timeout, or the disk is
full: its outcome cannot be committed. The run service releases the
conversation and tells the client anyway (a database that is away for a while
must not keep a conversation claimed in Redis for ever), and leaves the write
here. It is retried every second in the background and before the next run
starts, so the next run of the conversation never overtakes it. If the worker
stops first, start-up recovery marks the run ``interrupted``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

from worker.store import is_database_unavailable

log = structlog.get_logger(__name__)

RETRY_SECONDS = 1.0

Record = Callable[[], Awaitable[None]]


class UnrecordedOutcomes:
    def __init__(self, retry_seconds: float = RETRY_SECONDS) -> None:
        self.retry_seconds = retry_seconds
        self._pending: dict[str, Record] = {}
        self._lock = asyncio.Lock()
        self._retrier: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._pending)

    async def record(self, run_id: str, write: Record) -> bool:
        """Write now; if the database refuses, keep the write for later. True if written now."""
        try:
            async with self._lock:
                await write()
            return True
        except Exception as exc:
            if not is_database_unavailable(exc):
                raise
            log.warning("run.outcome_deferred", run_id=run_id, error=str(exc))
            self._pending[run_id] = write
            if self._retrier is None or self._retrier.done():
                self._retrier = asyncio.create_task(self._retry(), name="outcomes-retry")
            return False

    async def flush(self) -> bool:
        """Write every kept outcome, oldest first; False if the database still refuses."""
        async with self._lock:
            for run_id, write in list(self._pending.items()):
                try:
                    await write()
                except Exception as exc:
                    if not is_database_unavailable(exc):
                        # Not the database being away: retrying will not help.
                        log.exception("run.outcome_lost", run_id=run_id)
                        del self._pending[run_id]
                        continue
                    return False
                del self._pending[run_id]
                log.info("run.outcome_recorded_late", run_id=run_id)
        return True

    async def _retry(self) -> None:
        while self._pending:
            await asyncio.sleep(self.retry_seconds)
            await self.flush()

    async def close(self) -> None:
        """One last try, then stop retrying (recovery handles what is left)."""
        if self._retrier is not None:
            self._retrier.cancel()
        if self._pending:
            await self.flush()
