"""``python -m worker``: the single worker process. ``python -m worker --check``: is one alive?

``python -m worker --copy-to postgresql://…``: copy the SQLite database into an empty
PostgreSQL one (worker/upkeep/copy.py).

SIGTERM / SIGINT: stop taking jobs, ask the run in progress to stop at its next
step boundary (``RunControl.request_drain``), wait up to SHUTDOWN_TIMEOUT, then
close MCP sessions and SQLite and exit.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import TYPE_CHECKING, cast

import structlog

from shared.settings import Settings
from shared.settings_parsing import SettingsError

if TYPE_CHECKING:
    from arq.connections import RedisSettings

    from shared.speedups import Speedups
    from worker.queue.wakeup import WakeableWorker
    from worker.run.lifetime.stopping import LiveRuns


#: How long ending the runs a drain could not stop may take (a database write and a Redis script each).
_ABANDON_SECONDS = 20.0


def main() -> int:
    if sys.argv[1:] == ["--check"]:
        from worker.check import check

        return check()
    from shared.speedups import Speedups

    try:
        settings = Settings.from_env()
        speedups = Speedups.of(settings)
    except SettingsError as exc:
        print(f"sophos-worker: {exc}", file=sys.stderr)
        return 2
    # Before LangGraph is imported: a tampered checkpoint must fail closed.
    os.environ.setdefault("LANGGRAPH_STRICT_MSGPACK", "true")

    from shared.logging import configure_logging
    from shared.storage.engines import single_writer
    from worker.lock import WorkerLockHeld, WriterLock

    configure_logging(settings.log_format, trace_ids=settings.tracing)
    if sys.argv[1:2] == ["--copy-to"]:
        from worker.upkeep.copy import copy_to

        return copy_to(settings, sys.argv[2:])
    from shared import tracing

    # SQLite: one writer per file. PostgreSQL: any number, each run under a lease (run/lifetime/leases.py).
    lock = WriterLock(settings.lock_path)
    try:
        if single_writer(settings):
            lock.acquire()
    except WorkerLockHeld as exc:
        print(f"sophos-worker: {exc}", file=sys.stderr)
        return 1
    speedups.apply_json_codec()
    tracing.setup(settings, "sophos-worker")  # before the graph is built: its steps are traced
    try:
        with asyncio.Runner(loop_factory=speedups.loop_factory()) as runner:
            runner.run(serve(settings, speedups))
    finally:
        tracing.shutdown()  # the spans still buffered are exported
        lock.release()
    return 0


async def serve(settings: Settings, speedups: Speedups) -> None:
    """Take jobs until SIGTERM or SIGINT, then drain (module docstring)."""
    ctx: dict[str, object] = {"settings": settings}
    worker = _arq_worker(settings, speedups, ctx)
    _stop_on_signals(worker, ctx, settings)
    try:
        await worker.async_run()
    except asyncio.CancelledError:
        pass
    finally:
        await _jobs_ended(worker)
        await worker.close()
        structlog.get_logger("worker").info("worker.stopped")


async def _jobs_ended(worker: WakeableWorker) -> None:
    """Cut the jobs still going and wait for them, whatever they end with, then forget them.

    arq's ``close`` does the same but gathers them without ``return_exceptions``: a job cut past the
    shutdown timeout that ends cancelled (its step cut twice, by the drain and by arq) raised its
    ``CancelledError`` out of ``close`` before the stores and the tool sessions were closed, and
    the worker exited 1."""
    jobs = list(worker.tasks.values())
    for job in jobs:
        job.cancel()
    if jobs:
        await asyncio.gather(*jobs, return_exceptions=True)
    worker.tasks.clear()


def _arq_worker(settings: Settings, speedups: Speedups, ctx: dict[str, object]) -> WakeableWorker:
    from shared.contracts.codec import dumps, loads
    from shared.redis.keys import QUEUE_NAME
    from worker.jobs import functions, on_shutdown, on_startup
    from worker.queue.wakeup import WakeableWorker

    return WakeableWorker(
        functions=functions(settings),
        queue_name=QUEUE_NAME,
        redis_settings=_redis_settings(settings.redis_url),
        on_startup=on_startup,
        on_shutdown=on_shutdown,
        handle_signals=False,
        # Runs at once, each of its own conversation: a conversation's exclusivity is its
        # ACTIVE_RUNS claim in Redis, taken by the submit script before the job exists.
        max_jobs=settings.worker_concurrency,
        job_timeout=24 * 3600,  # runs end by themselves (recursion limit, model timeout)
        keep_result=60,
        idle_timeout=settings.poll_delay,
        job_serializer=dumps,
        job_deserializer=loads,
        ctx=ctx,
        parser_class=speedups.parser_class(),
    )


def _redis_settings(url: str) -> RedisSettings:
    from arq.connections import RedisSettings

    from shared.redis.connection import RETRY_ON, retry_policy

    base = RedisSettings.from_dsn(url)
    base.retry = retry_policy()
    base.retry_on_error = list(RETRY_ON)
    base.conn_retries = 30  # at start-up, wait for Redis rather than exit
    return base


def _stop_on_signals(worker: WakeableWorker, ctx: dict[str, object], settings: Settings) -> None:
    """SIGTERM or SIGINT, the first one heard: stop taking jobs, then drain."""
    loop = asyncio.get_running_loop()
    stopping = False

    def on_signal(sig: signal.Signals) -> None:
        nonlocal stopping
        if stopping:
            return
        stopping = True
        worker.allow_pick_jobs = False
        ctx["stop_task"] = loop.create_task(_drain_then_stop(worker, ctx, settings, sig))

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)


async def _drain_then_stop(
    worker: WakeableWorker, ctx: dict[str, object], settings: Settings, sig: signal.Signals,
) -> None:
    log = structlog.get_logger("worker")
    # The runs in progress, once the worker's resources are open (worker/jobs.py on_startup).
    live = cast("LiveRuns | None", getattr(ctx.get("service"), "live", None))
    draining = live.drain() if live is not None else 0
    log.info("worker.stopping", signal=sig.name, draining_runs=draining)
    pending = [t for t in worker.tasks.values() if not t.done()]
    if pending:
        _, late = await asyncio.wait(pending, timeout=settings.shutdown_timeout)
        if late:
            log.warning("worker.drain_timeout", runs=len(late))
            if live is not None:
                # Ended here, before arq cancels the jobs and the stores close under them.
                try:
                    async with asyncio.timeout(_ABANDON_SECONDS):
                        abandoned = await live.abandon()
                    log.warning("worker.runs_abandoned", runs=abandoned)
                except TimeoutError:
                    log.error("worker.abandon_timeout", timeout=_ABANDON_SECONDS)
            # Cut the steps still going, and let each finish what must outlive it before arq closes
            # the stores and the tool sessions under them: a call made as an MCP task sends its
            # cancel and records the answer (worker/tools/tasks.py, CANCEL_TIMEOUT at most). arq
            # would cancel them next all the same, without waiting: the ledger still said working.
            from worker.tools.tasks import CANCEL_TIMEOUT

            for task in late:
                task.cancel()
            await asyncio.wait(late, timeout=CANCEL_TIMEOUT + 1)
    worker.handle_sig(sig)

if __name__ == "__main__":
    sys.exit(main())
