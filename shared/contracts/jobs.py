"""The jobs the API (and the worker's upkeep) enqueue for the worker: frozen structs, one per arq
function, encoded and decoded by one codec (:mod:`shared.contracts.codec`).

Every job is safe to run twice: arq delivers at least once (the worker's handlers say how).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from shared.contracts.assistants import AgentConfig


class JobKind(enum.StrEnum):
    RUN = "run"  # a new message
    RESUME = "resume"  # continue the thread from its last checkpoint
    DECIDE = "decide"  # continue a thread waiting for an approval with the user's decisions
    #: make another branch of the thread the current one (``checkpoint_id``: its latest checkpoint)
    SWITCH = "switch"
    #: write the thread's state as a node would (the Agent Protocol's ``update_state``:
    #: ``update`` holds its ``values`` and ``as_node``)
    UPDATE = "update"


# --- jobs -----------------------------------------------------------------------

#: The one arq function the worker registers; the job id is the run id.
JOB_FUNCTION = "execute_run"


@dataclass(frozen=True, slots=True)
class RunJob:
    """Payload of a run or resume job. The arq job id is ``run_id``."""

    run_id: str
    conversation_id: str
    kind: JobKind
    message: str | None
    enqueued_at: float
    new_conversation: bool = False
    #: a ``decide`` job's decisions, one per pending request (:class:`Decision` as dicts)
    decisions: tuple[dict[str, Any], ...] | None = None
    #: the W3C trace context of the request that enqueued it (tracing on: shared/tracing.py)
    traceparent: str | None = None
    #: the checkpoint the run starts from instead of the thread's latest: where an edit or a
    #: regenerate forks, the head of the branch the conversation follows, or (``switch``) the
    #: head of the branch it is to follow (Branches, docs/api.md)
    checkpoint_id: str | None = None
    #: accepted with ``multitask_strategy`` ``enqueue``: it may be waiting behind the conversation's
    #: active run, and then claims the conversation when the worker takes it (worker/run/turns.py)
    may_wait: bool = False
    #: whose conversation it is (a new one: whoever asked), and who asked for this run (an
    #: operator may ask on a user's conversation); DESIGN.md "People and what they may touch"
    owner: str = "local"
    started_by: str | None = None
    #: the agent this run runs (an assistant's configuration, shared/contracts/assistants.py);
    #: None: the one the thread's last run had, or config/'s for a new thread
    agent: AgentConfig | None = None
    #: an ``update`` job's ``{"values": ..., "as_node": ...}`` (worker/run/updates.py)
    update: dict[str, Any] | None = None
    #: a ``resume`` job's Agent Protocol ``command`` without ``resume``: ``{"goto", "update"}``,
    #: given to the graph as LangGraph's ``Command`` (worker/run/inputs.py)
    command: dict[str, Any] | None = None
    #: where the run stops, the Agent Protocol's ``interrupt_before`` and ``interrupt_after``:
    #: ``{"before": [node, ...] | "*", "after": ...}`` (worker/run/service.py)
    breakpoints: dict[str, Any] | None = None
    #: when the run is due (epoch seconds), for a run created with ``after_seconds``: its job's
    #: score in the queue, so no worker takes it before (shared/redis/queue.py)
    due_at: float | None = None


class DecisionAction(enum.StrEnum):
    APPROVE = "approve"
    REJECT = "reject"
    EDIT = "edit"


@dataclass(frozen=True, slots=True)
class Decision:
    """The user's answer to one pending tool call (``id`` = the tool call id)."""

    id: str
    action: DecisionAction
    arguments: dict[str, Any] | None = None
    message: str | None = None
    #: who decided: the decision run's ``started_by``, stamped by the worker (worker/run/inputs.py)
    by: str | None = None


#: The arq function that deletes a conversation (DELETE /api/conversations/{id}).
DELETE_FUNCTION = "delete_conversation"
_DELETE_CLAIM = "delete:"


@dataclass(frozen=True, slots=True)
class DeleteJob:
    """Payload of a delete job. Its arq job id, and its claim in ``ACTIVE_RUNS``, is ``claim``."""

    conversation_id: str
    claim: str
    enqueued_at: float
    #: why: a client's DELETE (``request``) or ``CONVERSATION_RETENTION_DAYS`` (``retention``)
    reason: str = "request"


def delete_claim(job_id: str) -> str:
    """What a delete holds ``ACTIVE_RUNS`` with (and its arq job id): never a run id, so a
    run cannot be accepted for the conversation while it is being deleted."""
    return f"{_DELETE_CLAIM}{job_id}"


def is_delete_claim(holder: str) -> bool:
    return holder.startswith(_DELETE_CLAIM)


#: The arq function that renames a conversation (PATCH /api/conversations/{id}).
RENAME_FUNCTION = "rename_conversation"
#: The longest title a rename may give (characters, after whitespace is collapsed).
TITLE_MAX_CHARS = 200


@dataclass(frozen=True, slots=True)
class RenameJob:
    """Payload of a rename job; ``job_id`` (``rename:<uuid>``) is its arq job id.

    Safe twice: it writes the same title again. It holds no claim in ``ACTIVE_RUNS``: a run
    never writes a title that exists (worker/store.py ``start_run``), so a rename and a run
    of one conversation may go in either order.
    """

    conversation_id: str
    title: str
    job_id: str
    enqueued_at: float


#: The arq function that copies a thread (the Agent Protocol's ``POST /threads/{id}/copy``).
COPY_FUNCTION = "copy_thread"


@dataclass(frozen=True, slots=True)
class CopyJob:
    """Payload of a copy job; ``job_id`` (``copy:<uuid>``) is its arq job id.

    Safe twice: the saver writes a checkpoint (and a write) with the same ids again, and the
    conversation's row is inserted only if missing. It holds no claim: the API refuses a copy
    while a run holds the source (api/protocol/threads/copies.py).
    """

    source_id: str
    target_id: str
    #: whose the copy is: whoever asked for it
    owner: str
    job_id: str
    enqueued_at: float


#: The arq function that prunes old checkpoints (``POST /api/checkpoints/prune``, ``sophos prune``).
PRUNE_FUNCTION = "prune_checkpoints"


@dataclass(frozen=True, slots=True)
class PruneJob:
    """Payload of a prune job; ``job_id`` (``prune:<uuid>``, the same for each of its batches)
    names it in arq and in the progress it records (``prune_key``).

    It prunes a batch of conversations after the cursor (``after_updated``, ``after_id``: their
    ``updated_at`` and id, oldest first), then enqueues itself for the next batch, so runs are
    taken between batches. Safe twice: pruning a thread again deletes nothing more. It holds no
    claim: a conversation with a run queued, running or waiting is skipped (worker/upkeep/pruning.py).
    """

    job_id: str
    enqueued_at: float
    after_updated: str = ""
    after_id: str = ""
    #: batches done before this one
    batch: int = 0
