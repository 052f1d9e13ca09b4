"""Forks and rollbacks through the Agent Protocol, mapped onto Sophos's branches (api/chat/branches.py).

**A fork** (``checkpoint_id``, or ``checkpoint: {"checkpoint_id": ...}``, on a run) starts the run
from that checkpoint of the thread instead of its latest: the worker runs it from there
(``RunJob.checkpoint_id``, as for an edit on the web page), so its checkpoints are children of
it beside the other branch's, which stay. The checkpoint is checked first, before anything
changes: the thread must have it (404), a new message may not go where a decision is awaited,
and a run without input resumes the checkpoint's pending tasks (409 when it has none).

**A rollback** never deletes: the ledger and the branches need what a run did. It cancels the run
(as ``interrupt`` does), waits for its end, and then the thread's current branch goes back to
the checkpoint the cancelled run started from (the parent of its first checkpoint), so the next
run starts as if the cancelled one had not happened. The cancelled run's checkpoints stay, as an
abandoned branch, and the run stays, ``interrupted``. With ``multitask_strategy="rollback"`` the
new run itself forks there; with ``runs.cancel(action="rollback")`` a ``switch`` run (the web
page's way of changing branch) makes that checkpoint the conversation's branch head.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog

from api.chat.forks import follow
from api.chat.submit import ChatService
from api.protocol.runs.fork_reads import Started, checkpoint_at, run_started
from api.runs.cancel import cancel_run
from api.runs.views import Runs
from api.store import Store
from shared.errors import (
    ApprovalPending,
    BadRequest,
    NotForkable,
    NotFound,
    RunNotResumable,
    SessionInProgress,
)

log = structlog.get_logger(__name__)

_CHECKPOINT_ID = re.compile(r"[0-9A-Za-z-]{1,64}")
#: how long a rollback waits for the cancelled run, then for its switch, to end (a cancel ends a
#: running run within a second)
ROLLBACK_WAIT_SECONDS = 30.0


def checkpoint_of(checkpoint_id: str | None, checkpoint: dict[str, Any] | None) -> str | None:
    """The checkpoint a run forks from: ``checkpoint_id``, or ``checkpoint``'s (checked)."""
    named = (checkpoint or {}).get("checkpoint_id")
    if checkpoint is not None:
        if (checkpoint.get("checkpoint_ns") or "") != "":
            raise BadRequest("checkpoint.checkpoint_ns must be empty: the agent has no subgraphs")
        if not named:
            raise BadRequest("checkpoint must carry a checkpoint_id")
        if checkpoint_id is not None and checkpoint_id != named:
            raise BadRequest("checkpoint_id and checkpoint name different checkpoints: send one")
    chosen = checkpoint_id if checkpoint_id is not None else named
    if chosen is None:
        return None
    if not isinstance(chosen, str) or not _CHECKPOINT_ID.fullmatch(chosen):
        raise BadRequest("a checkpoint id is letters, digits and '-'")
    return chosen


# --- in the API --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Forks:
    chat: ChatService
    runs: Runs
    store: Store
    #: waits for the end of a run (thread id, run id)
    ended: Callable[[str, str], Awaitable[Any]]

    async def check(self, thread_id: str, checkpoint_id: str, message: str | None) -> None:
        """Refuse a fork from ``checkpoint_id`` before anything changes."""
        at = await self.store.read_thread(thread_id, functools.partial(checkpoint_at, checkpoint_id))
        if at is None:
            raise NotFound(f"checkpoint {checkpoint_id} of thread {thread_id} not found")
        if at.waiting:
            raise ApprovalPending(
                f"checkpoint {checkpoint_id} waits for a decision on tool calls: a run from it would "
                "abandon the decision (fork from another checkpoint)"
            )
        if message is None and not at.pending:
            raise RunNotResumable(
                f"checkpoint {checkpoint_id} has nothing to resume: a run from it without input needs "
                "a checkpoint with a step still to run (send a message to fork from it)"
            )

    async def started(self, thread_id: str, run_id: str) -> Started | None:
        return await self.store.read_thread(thread_id, functools.partial(run_started, run_id))

    async def wait_end(self, thread_id: str, run_id: str, what: str) -> None:
        try:
            async with asyncio.timeout(ROLLBACK_WAIT_SECONDS):
                await self.ended(thread_id, run_id)
        except TimeoutError as exc:
            raise SessionInProgress(f"thread {thread_id}: run {run_id} {what} but has not ended yet") from exc

    async def new_run_start(self, thread_id: str, cancelled: str) -> str | None:
        """Where a new message starts after ``cancelled`` was rolled back: where that run started;
        for a thread's first run, its input checkpoint, whose message the new one replaces (as an
        edit of the first message does). None: the run wrote nothing, so nothing is undone."""
        started = await self.started(thread_id, cancelled)
        if started is None:
            return None
        return started.parent or (started.first if started.received else None)

    async def rollback(self, thread_id: str, run_id: str) -> None:
        """``runs.cancel(action="rollback")``: cancel the run, wait for its end, then follow the
        branch it started from (a ``switch`` run), and wait for that too."""
        started = await self.started(thread_id, run_id)
        if started is not None and started.parent is None:
            raise _first_run(run_id)
        await cancel_run(self.runs, run_id)  # a finished run: 409 RUN_FINISHED, nothing changed
        await self.wait_end(thread_id, run_id, "was cancelled")
        started = await self.started(thread_id, run_id)
        if started is None:
            log.info("protocol.rolled_back", conversation_id=thread_id, run_id=run_id, wrote=False)
            return  # cancelled before it wrote anything: nothing to go back from
        if started.parent is None:  # it recorded its message between the check and the cancel
            raise _first_run(run_id, cancelled=True)
        switch = await follow(self.chat, thread_id, started.parent)
        log.info("protocol.rolled_back", conversation_id=thread_id, run_id=run_id, to=started.parent)
        with contextlib.suppress(NotFound):
            await self.wait_end(thread_id, switch.run, "(the rollback's switch) was accepted")


def _first_run(run_id: str, *, cancelled: bool = False) -> NotForkable:
    done = "it was cancelled, and " if cancelled else ""
    return NotForkable(
        f"run {run_id} is the thread's first: {done}there is no checkpoint before it to roll back to "
        "(cancel it with action=interrupt, or start the next run with multitask_strategy=rollback)"
    )
