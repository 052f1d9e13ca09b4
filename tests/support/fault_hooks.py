"""The worker's fault hooks: test code, loaded by the worker's hook point (worker/faults.py)
only when a SOPHOS_FAULT_* setting asks for a fault.

Some crash windows are too narrow to hit with a signal from outside (after the
final checkpoint, before the outcome is recorded; after the run row, before
the input checkpoint). With ``SOPHOS_FAULT_KILL_AFTER_CHECKPOINT=N`` the worker
SIGKILLs itself right after its Nth checkpoint write since start-up (all runs
together), with
``SOPHOS_FAULT_KILL_BEFORE_CHECKPOINT=N`` right before it (once the step's task
results are saved): exactly what ``kill -9`` at that instant would do. With
``SOPHOS_FAULT_KILL_AFTER_OUTCOME=N`` it dies right after its Nth commit of a tool
call's outcome to the ledger (worker/tools/ledger/records.py), before LangGraph saves the call's
task writes: the window where only the ledger knows the call ran.

The other points of a tool call's way through the ledger are held, not killed:
``SOPHOS_FAULT_HOLD_CALL=POINT:TOOL`` (POINT: ``before_intent``, ``after_intent``,
``before_task_state``: the server made the call's MCP task and its id is not committed yet, or
``before_outcome``) stops the first call of TOOL there for good, and logs
``faults.holding``; the test kills the worker from outside once the turn's other calls
have settled. The calls of a turn run side by side, so a kill at the instant one call
reaches a point would catch its siblings anywhere; holding it there while they finish is
one instant a real ``kill -9`` can hit, and the same one every time.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from shared.settings import Settings
from worker.faults import Faults

log = structlog.get_logger(__name__)


def faults(settings: Settings) -> Faults:
    """The hooks the settings ask for (worker/faults.py ``load`` calls this)."""
    return Faults(
        checkpoint=kill_at_checkpoint(
            settings.fault_kill_before_checkpoint, settings.fault_kill_after_checkpoint
        ),
        after_outcome=kill_after_outcome(settings.fault_kill_after_outcome),
        hold=hold_call(settings.fault_hold_call),
    )


class _KillAtCheckpoint:
    """The hook, mixed in before whichever saver the worker runs on (SQLite's, or PostgreSQL's:
    shared/storage/engines.py)."""

    kill_before: int = 0
    kill_after: int = 0
    written: int = 0

    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        # This write's number, taken before the first await: with WORKER_CONCURRENCY > 1
        # writes of several runs overlap, and each must get a number of its own.
        self.written += 1
        number = self.written
        if number == self.kill_before:
            # "Right before" means after everything the step saved first: LangGraph
            # writes a finished task's result (put_writes) in a background task that
            # may still hold the saver's lock. Let it finish, then die.
            await asyncio.sleep(0.05)
            # Every permit of the lock (PostgreSQL's is a semaphore): no write is in flight.
            for _ in range(getattr(self, "size", 1)):
                await self.lock.acquire()  # type: ignore[attr-defined]
            os.kill(os.getpid(), signal.SIGKILL)
        result = await super().aput(config, checkpoint, metadata, new_versions)  # type: ignore[misc]
        if number == self.kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
        return result


def kill_at_checkpoint(before: int, after: int) -> type | None:
    """The saver's hook that SIGKILLs right before the ``before``-th or right after the
    ``after``-th checkpoint write (0: never); None when neither is asked for."""
    if before <= 0 and after <= 0:
        return None
    return type("KillAtCheckpoint", (_KillAtCheckpoint,), {"kill_before": before, "kill_after": after})


def kill_after_outcome(number: int) -> Callable[[], None] | None:
    """The ledger's ``after_outcome`` hook: SIGKILL at the ``number``-th outcome commit (0: none)."""
    if number <= 0:
        return None
    committed = 0

    def after_outcome() -> None:
        nonlocal committed
        committed += 1
        if committed == number:
            os.kill(os.getpid(), signal.SIGKILL)

    return after_outcome


def hold_call(spec: str | None) -> Callable[[str, str], Awaitable[None]] | None:
    """The ledger's ``hold`` hook for ``SOPHOS_FAULT_HOLD_CALL`` (``POINT:TOOL``, checked by
    shared/settings.py), None when it is not set: the first call of TOOL to reach POINT
    never goes on."""
    if not spec:
        return None
    point, _, tool = spec.partition(":")
    held = False

    async def hold(at: str, name: str) -> None:
        nonlocal held
        if held or at != point or name != tool:
            return
        held = True
        log.warning("faults.holding", point=at, tool=name)
        await asyncio.Event().wait()

    return hold
