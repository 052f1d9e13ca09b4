"""Outcomes the database refused to record, written as soon as it takes writes again.

A run ends while the database is locked past its busy timeout, the disk is
full, or it raises anything else on that write (a damaged file, a constraint):
its outcome cannot be committed. The run service releases the conversation and
tells the client anyway (a database that is away for a while must not keep a
conversation claimed in Redis for ever), and leaves the write here. It is
retried every second in the background and before the next run starts, so the
next run never overtakes it: while it is refused, new runs are refused too
(``DATABASE_UNAVAILABLE``), each with its terminal event. Every kind of refusal
is retried, not only "unavailable": the write is the run's only record, and a
database that raised something else may take it once repaired. If the worker
stops first, start-up recovery marks the run ``interrupted``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

from shared.storage.leases import LeaseLost
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
        """Write now; if that raises anything, keep the write for later. True if written now."""
        try:
            async with self._lock:
                await write()
            return True
        except LeaseLost:
            raise  # not for a retry: another worker has recorded the run
        except Exception as exc:
            _log_refusal("run.outcome_deferred", run_id, exc, trace=True)
            self._pending[run_id] = write
            if self._retrier is None or self._retrier.done():
                self._retrier = asyncio.create_task(self._retry(), name="outcomes-retry")
            return False

    async def flush(self) -> bool:
        """Write every kept outcome, oldest first; False if the database still refuses one."""
        async with self._lock:
            for run_id, write in list(self._pending.items()):
                try:
                    await write()
                except LeaseLost as exc:
                    log.warning("run.dropped", run_id=run_id, reason=str(exc))
                except Exception as exc:
                    _log_refusal("run.outcome_retry_failed", run_id, exc)
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


def _log_refusal(event: str, run_id: str, exc: Exception, *, trace: bool = False) -> None:
    error = f"{type(exc).__name__}: {exc}"
    if is_database_unavailable(exc):
        log.warning(event, run_id=run_id, error=error)
    else:
        # Not the database being away: someone should look (a damaged file, a bug).
        # The traceback once, when the write is first refused, not at every retry.
        log.error(event, run_id=run_id, error=error, exc_info=exc if trace else None)
