"""A run's ending, in one place: :meth:`RunEnding.end`.

Whatever ends a run calls it, and only says why (the *cause*): completion, an
approval, a failure, a cancel or a cut (worker/run/service.py), a run the database
refused to record, an orphan found at start-up or a lapsed lease taken over
(worker/run/lifetime/recovery.py), SIGTERM past ``SHUTDOWN_TIMEOUT`` or arq cancelling the job.
The ending then, in this order:

1. **Derives the status from the thread** (:func:`settle`): a pending interrupt
   means the conversation waits for a decision, whatever ended the run (a decision
   run cancelled, cut or killed before its approval node's checkpoint leaves the
   interrupt pending: the approval is asked again, never lost); pending tasks mean
   a resume can finish it.
2. **Records it**, with where the run spent its time when the caller timed it (its breakdown)
   and, for a run ``cancelled``, who asked (its cancel marker, ``cancel_key``), through the storage
   interface (fenced on PostgreSQL: a worker that lost its lease records nothing, :class:`LeaseLost`
   reaches the caller). A database that refuses keeps the write for a retry
   (worker/run/outcome/outcomes.py); the client is told all the same. A run that has no row (the database
   refused to record its start) is described in its Redis hash instead.
3. **Notifies**, persist-then-notify: in one Redis script (``END_RUN_LUA``) the claim
   is compared-and-deleted, the ``approval`` and terminal events appended after the
   run's last event, the stream's expiry set, the outcome counted (its duration
   observed by status, in the same round trip) and the run's webhook, if it has one,
   enqueued for delivery (shared/contracts/webhooks.py). Redis away: the
   script is retried in the background for as long as events are
   (``GIVE_UP_SECONDS``); the sweep frees a claim whose run is recorded finished.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import structlog
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import StateSnapshot
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import NoScriptError, RedisError

from shared.contracts.runs import RunStatus
from shared.contracts.webhooks import hook_keys_args
from shared.redis.keys import (
    ACTIVE_RUNS,
    QUEUE_NAME,
    WAKE_LIST,
    cancel_key,
    cancelled_by,
    events_key,
    waiting_key,
)
from shared.redis.metrics import (
    METRICS_KEY,
    RUN_DURATION,
    RUNS_FINISHED,
    MetricBatch,
    counter_field,
    queue_increments,
)
from shared.redis.queue import record_ended
from shared.redis.scripts import WAKE_NEXT_TURN_SHA, scripts
from shared.settings import Settings
from shared.storage.rows import Breakdown
from shared.storage.threads.branch import thread_config
from shared.storage.threads.interrupts import interrupt_requests
from worker.run.outcome.outcomes import UnrecordedOutcomes
from worker.run.publish.events import GIVE_UP_SECONDS, WRITE_TIMEOUT, EventPublisher
from worker.store import RunStore

log = structlog.get_logger(__name__)

#: The code of a new message refused because the conversation waits for a decision.
APPROVAL_PENDING = "APPROVAL_PENDING"

# Endings still being written to a Redis that was away (kept from garbage collection).
_retrying: set[asyncio.Task[None]] = set()


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a run ended: its status, the error (if any) and, when waiting, the calls to decide."""

    status: RunStatus
    code: str | None = None
    message: str | None = None
    requests: list[dict[str, Any]] | None = None


@dataclass(frozen=True, slots=True)
class Thread:
    """What a run's ending needs of its thread; None where it could not be read."""

    message_count: int | None = None
    #: tasks are left to run (the conversation is resumable, or waits for a decision)
    pending: bool | None = None
    #: the pending interrupt's requests: the tool calls waiting for a decision
    requests: list[dict[str, Any]] | None = None


def thread_of(state: StateSnapshot) -> Thread:
    return Thread(
        message_count=len((state.values or {}).get("messages", [])),
        pending=bool(state.tasks),
        requests=interrupt_requests(state),
    )


def settle(cause: Outcome, thread: Thread) -> Outcome:
    """The run's outcome: what its cause says, unless the thread says it waits for a decision.

    A pending interrupt means ``waiting`` whatever ended the run: the decision is still
    to be made (a cancel, a cut, a crash or a drain came before the approval node's
    checkpoint). A refused message keeps its code and message, so the user learns it
    was not recorded.
    """
    if thread.requests is None:
        return cause
    if cause.status is RunStatus.WAITING or cause.code == APPROVAL_PENDING:
        return replace(cause, status=RunStatus.WAITING, requests=thread.requests)
    return Outcome(RunStatus.WAITING, requests=thread.requests)


class RunEnding:
    """Ends runs: derive, record, notify (module docstring)."""

    def __init__(
        self, settings: Settings, redis: Redis, store: RunStore,
        graph: CompiledStateGraph[Any, Any, Any, Any], unrecorded: UnrecordedOutcomes,
    ) -> None:
        self.settings = settings
        self.redis = redis
        self.store = store
        self.graph = graph
        self.unrecorded = unrecorded

    async def read_thread(self, conversation_id: str, run_id: str | None = None) -> Thread:
        """The shape of the branch the conversation follows; unknown (all None) when it cannot be
        read. Never raises."""
        try:
            config = await thread_config(self.store.db.fetchall, conversation_id)
            return thread_of(await self.graph.aget_state(config))
        except Exception as exc:
            # Database away, or a checkpoint it cannot read: the run ends all the same
            # (without the counts), or it would stay `running`.
            log.warning(
                "run.state_unreadable", error=f"{type(exc).__name__}: {exc}",
                **({"run_id": run_id, "conversation_id": conversation_id} if run_id else {}),
            )
            return Thread()

    async def end(
        self, run_id: str, conversation_id: str, cause: Outcome, *,
        thread: Thread | None = None, events: EventPublisher | None = None,
        steps: int | None = None, recorded: bool = True, along: Callable[[Pipeline], None] | None = None,
        duration: float | None = None, breakdown: Breakdown | None = None,
    ) -> Outcome:
        """End the run: derive its status from the thread, record it, then notify.

        ``thread``: the thread as the caller already knows it (a run that reached END);
        read here otherwise. ``events``: the run's publisher, flushed first so the
        ending follows every event of the run. ``recorded``: False for a run that has
        no row (its start was refused): it is described in Redis instead. ``along``: commands
        that ride in the ending's round trip (the run's progress, forgotten; its metrics).
        ``duration``: seconds from the run's start, observed by outcome; ``breakdown``: where
        they went, recorded with the outcome.
        Raises :class:`LeaseLost` (nothing recorded, nothing published) when another
        worker owns the run now.
        """
        if thread is None:
            thread = await self.read_thread(conversation_id, run_id)
        outcome = settle(cause, thread)
        by = await self._cancelled_by(run_id) if outcome.status is RunStatus.CANCELLED else None
        if recorded:
            async def write() -> None:
                await self.store.finish_run(
                    run_id, conversation_id,
                    status=outcome.status, error_code=outcome.code, error_message=outcome.message,
                    message_count=thread.message_count, pending_tasks=thread.pending, step_count=steps,
                    breakdown=breakdown, cancelled_by=by,
                )

            if events is not None:
                # The run's events reach Redis before its outcome is committed: a client that
                # finds the run finished and its stream empty takes the stream as expired
                # (api/chat/relay.py). Bounded: with Redis away the outcome is recorded all the same.
                await events.flush(WRITE_TIMEOUT)
            # Whatever the database raises, the outcome is kept and retried until taken.
            await self.unrecorded.record(run_id, write)
        else:
            try:
                await record_ended(self.redis, run_id, conversation_id, {
                    "status": outcome.status.value, "failed_at": f"{time.time():.6f}",
                    "error_code": outcome.code or "", "error_message": outcome.message or "",
                    **({"cancelled_by": by} if by else {}),
                })
            except RedisError as exc:
                log.warning("run.describe_failed", error=str(exc))
        first_id, riders = 1, []
        if events is not None:
            first_id = await events.close()
            riders = events.take_along()  # after every event batch that carried the run's progress
        if along is not None:
            riders.append(along)
        riders.append(wake_next_turn(conversation_id))
        if duration is not None:
            timing = MetricBatch()
            timing.observe(RUN_DURATION, duration, {"status": outcome.status.value})
            riders.append(lambda pipe: queue_increments(pipe, timing))
        await self._notify(run_id, conversation_id, outcome, first_id, riders)
        return outcome

    async def _cancelled_by(self, run_id: str) -> str | None:
        """Who asked to cancel the run, as its cancel marker says (api/runs/cancel.py); still
        there, since the ending's own round trip deletes it. Redis away: not known, the run is
        cancelled all the same."""
        try:
            async with asyncio.timeout(WRITE_TIMEOUT):
                return cancelled_by(await self.redis.get(cancel_key(run_id)))
        except (RedisError, OSError, TimeoutError) as exc:
            log.warning("run.cancel_marker_unreadable", run_id=run_id, error=str(exc) or type(exc).__name__)
            return None

    async def _notify(
        self, run_id: str, conversation_id: str, outcome: Outcome, first_id: int,
        riders: list[Callable[[Pipeline], None]],
    ) -> None:
        args: list[Any] = [
            conversation_id, run_id, outcome.status.value, outcome.code or "", outcome.message or "",
            "" if outcome.status is not RunStatus.WAITING else json.dumps(outcome.requests or []),
            str(first_id), str(self.settings.event_retention),
            counter_field(RUNS_FINISHED, status=outcome.status.value),
        ]
        # The run's webhook, if it has one, is enqueued by the same script (shared/contracts/webhooks.py).
        hook_keys, hook_args = hook_keys_args(run_id, conversation_id)
        keys = [ACTIVE_RUNS, events_key(run_id), METRICS_KEY, *hook_keys]
        args += hook_args
        script = scripts(self.redis).end_run

        async def send() -> None:
            async with asyncio.timeout(WRITE_TIMEOUT), self.redis.pipeline(transaction=False) as pipe:
                # EVALSHA queued as a plain command: a Script queued on a pipeline makes
                # redis-py ask SCRIPT EXISTS first, one more round trip on every run's end.
                pipe.evalsha(script.sha, len(keys), *keys, *args)
                spans = []  # each rider's commands, to send again the ones Redis did not know
                for ride in riders:
                    start = len(pipe.command_stack)
                    ride(pipe)
                    spans.append((ride, start, len(pipe.command_stack)))
                replies = await pipe.execute(raise_on_error=False)
            if isinstance(replies[0], NoScriptError):  # Redis restarted since: load it, once
                replies[0] = await script(keys=keys, args=args)
            if isinstance(replies[0], Exception):
                raise replies[0]
            # A rider whose every command Redis did not know did nothing (Redis restarted, or is
            # new): sent again once the scripts are loaded (the wake of the next turn among them).
            unknown = [ride for ride, start, end in spans
                       if end > start and all(isinstance(r, NoScriptError) for r in replies[start:end])]
            failed = [r for ride, start, end in spans if ride not in unknown for r in replies[start:end]]
            if any(isinstance(reply, NoScriptError) for reply in replies[1:]):
                await scripts(self.redis).load()
            if unknown:
                async with asyncio.timeout(WRITE_TIMEOUT), self.redis.pipeline(transaction=False) as again:
                    for ride in unknown:
                        ride(again)
                    failed += await again.execute(raise_on_error=False)
            for reply in failed:  # a view (progress, metrics): not worth a second ending
                if isinstance(reply, Exception):
                    log.warning("run.notify_along_failed", run_id=run_id, error=str(reply))

        try:
            await send()
            return
        except (RedisError, OSError, TimeoutError) as exc:
            log.warning("run.notify_failed", run_id=run_id, error=str(exc) or type(exc).__name__)

        async def retry() -> None:
            deadline = time.monotonic() + GIVE_UP_SECONDS
            delay = 0.1
            while time.monotonic() < deadline:
                await asyncio.sleep(delay)
                delay = min(1.0, delay * 2)
                try:
                    await send()
                    log.info("run.notified_late", run_id=run_id)
                    return
                except (RedisError, OSError, TimeoutError):
                    continue
            # The sweep frees the claim of a run recorded finished; the relay rebuilds its end.
            log.error("run.notify_dropped", run_id=run_id)

        task = asyncio.create_task(retry(), name=f"end-{run_id}")
        _retrying.add(task)
        task.add_done_callback(_retrying.discard)


def wake_next_turn(conversation_id: str) -> Callable[[Pipeline], None]:
    """A rider of a run's ending (after the script that freed the conversation): the run waiting
    first on it takes its turn now, instead of when its deferral would have looked again."""

    def ride(pipe: Pipeline) -> None:
        # EVALSHA queued as a plain command, as the ending's own (send() loads it after a restart)
        pipe.evalsha(
            WAKE_NEXT_TURN_SHA, 3, waiting_key(conversation_id), QUEUE_NAME, WAKE_LIST,
            str(int(time.time() * 1000)),
        )

    return ride
