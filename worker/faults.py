"""Where a test may stop the worker at a chosen instant: the hook points, and their loading.

Some crash windows are too narrow to hit with a signal from outside (after the final
checkpoint, before the outcome is recorded; between a tool call's outcome and its task's
writes), so the fault tests have the worker stop itself there. The worker has three hook
points, each empty unless a test fills it: a class mixed in before the checkpoint saver
(outermost: shared/storage/engines.py ``open_checkpointer``), a callback after each commit
of a tool call's outcome, and an awaitable at each point of a call's way through the ledger
(worker/tools/ledger/calls.py ``Ledger``).

The hooks themselves are test code (tests/support/fault_hooks.py, which the installed
package does not hold). :func:`load` imports them only when a ``SOPHOS_FAULT_*`` setting asks
for a fault, which only the tests set, on a checkout; otherwise nothing of the tests is loaded.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from shared.settings import Settings

log = structlog.get_logger(__name__)

#: the test-only module holding the hooks; it has ``faults(settings) -> Faults``
HOOKS_MODULE = "tests.support.fault_hooks"


@dataclass(frozen=True, slots=True)
class Faults:
    """The hooks of one worker process; every one None in production."""

    #: mixed in before the checkpoint saver (and before the other hooks of its writes)
    checkpoint: type | None = None
    #: the ledger's: called after each commit of a tool call's outcome
    after_outcome: Callable[[], None] | None = None
    #: the ledger's: ``hold(point, tool)`` awaited before a call's intent, after it, before each
    #: commit of its MCP task's state (the first: the task's id), and before its outcome's commit
    hold: Callable[[str, str], Awaitable[None]] | None = None


def asked(settings: Settings) -> bool:
    return bool(
        settings.fault_kill_after_checkpoint > 0 or settings.fault_kill_before_checkpoint > 0
        or settings.fault_kill_after_outcome > 0 or settings.fault_hold_call
    )


def load(settings: Settings) -> Faults:
    """The hooks the settings ask for; no hook, and nothing imported, when none is asked for."""
    if not asked(settings):
        return Faults()
    hooks: Faults = importlib.import_module(HOOKS_MODULE).faults(settings)
    log.warning(
        "faults.enabled", kill_after_checkpoint=settings.fault_kill_after_checkpoint,
        kill_before_checkpoint=settings.fault_kill_before_checkpoint,
        kill_after_outcome=settings.fault_kill_after_outcome, hold_call=settings.fault_hold_call,
    )
    return hooks
