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
from typing import TYPE_CHECKING

import structlog

from shared.settings import Settings, SettingsError

if TYPE_CHECKING:
    from shared.speedups import Speedups


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

    # SQLite: one writer per file. PostgreSQL: any number, each run under a lease (worker/run/leases.py).
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
    from arq.connections import RedisSettings

    from shared.contracts.codec import dumps, loads
    from shared.redis.connection import RETRY_ON, retry_policy
    from shared.redis.keys import QUEUE_NAME
    from worker.wakeup import WakeableWorker

    def redis_settings(url: str) -> RedisSettings:
        base = RedisSettings.from_dsn(url)
        base.retry = retry_policy()
        base.retry_on_error = list(RETRY_ON)
        base.conn_retries = 30  # at start-up, wait for Redis rather than exit
        return base

    from worker.jobs import functions, on_shutdown, on_startup

    log = structlog.get_logger("worker")
    ctx: dict[str, object] = {"settings": settings}
    worker = WakeableWorker(
        functions=functions(settings),
        queue_name=QUEUE_NAME,
        redis_settings=redis_settings(settings.redis_url),
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
    loop = asyncio.get_running_loop()
    stopping = False

    async def drain_then_stop(sig: signal.Signals) -> None:
        service = ctx.get("service")
        draining = service.drain() if service is not None else 0  # type: ignore[attr-defined]
        log.info("worker.stopping", signal=sig.name, draining_runs=draining)
        pending = [t for t in worker.tasks.values() if not t.done()]
        if pending:
            _, late = await asyncio.wait(pending, timeout=settings.shutdown_timeout)
            if late:
                log.warning("worker.drain_timeout", runs=len(late))
                if service is not None:
                    # Ended here, before arq cancels the jobs and the stores close under them.
                    try:
                        async with asyncio.timeout(_ABANDON_SECONDS):
                            abandoned = await service.abandon()  # type: ignore[attr-defined]
                        log.warning("worker.runs_abandoned", runs=abandoned)
                    except TimeoutError:
                        log.error("worker.abandon_timeout", timeout=_ABANDON_SECONDS)
        worker.handle_sig(sig)

    def on_signal(sig: signal.Signals) -> None:
        nonlocal stopping
        if stopping:
            return
        stopping = True
        worker.allow_pick_jobs = False
        ctx["stop_task"] = loop.create_task(drain_then_stop(sig))

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await worker.async_run()
    except asyncio.CancelledError:
        pass
    finally:
        await worker.close()
        log.info("worker.stopped")


if __name__ == "__main__":
    sys.exit(main())
