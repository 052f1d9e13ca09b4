"""What the API and the worker both say of an Agent Protocol run: its status in the SDK's words,
the protocol's record beside it (``protocol_run_key``), the SDK's ``Run`` shape and a thread's
``values``.

The API answers ``runs.get`` with :func:`sdk_run` (api/protocol/runs/service.py); the worker sends the
same shape to the run's webhook (worker/schedule/webhooks.py).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from shared.contracts.runs import RunStatus

# langchain is imported by values_of, which runs where a thread is read (a reader process, the
# worker): the API's main process, which imports this module, never loads it (api/store.py).
if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage

    from shared.storage.threads.stand_ins import Snapshot as StateSnapshot

#: the one graph, and the one assistant's id: fixed, so a client may keep it (a UUID5 of the graph id)
GRAPH_ID = "agent"
ASSISTANT_ID = str(uuid.uuid5(uuid.UUID("6ba7b821-9dad-11d1-80b4-00c04fd430c8"), GRAPH_ID))
DEFAULT_STREAM_MODES = ("values",)

SdkRunStatus = Literal["pending", "running", "success", "error", "interrupted", "timeout"]

#: ``timeout`` is never given: no Sophos run ends for lack of time (AGENT_RECURSION_LIMIT is an error).
SDK_RUN_STATUS: dict[RunStatus, SdkRunStatus] = {
    RunStatus.QUEUED: "pending",
    RunStatus.RUNNING: "running",
    RunStatus.COMPLETED: "success",
    RunStatus.FAILED: "error",
    # Stopped before its end by a crash or a drain; the thread keeps what it did and resumes.
    RunStatus.INTERRUPTED: "interrupted",
    # The Agent Server has no `cancelled`: a cancelled run is `interrupted` there.
    RunStatus.CANCELLED: "interrupted",
    # As the Agent Server: a run that pauses for a decision ends `success`; its thread is `interrupted`.
    RunStatus.WAITING: "success",
}

#: the code of a message refused because its thread waits for a decision: its run ended
#: ``waiting`` (the thread waits), but the run itself did nothing it was asked to
REFUSED_OVER_A_DECISION = "APPROVAL_PENDING"


def sdk_status(status: RunStatus, error_code: str | None = None) -> SdkRunStatus:
    """The SDK's status of a run: :data:`SDK_RUN_STATUS`, except that a run whose message was
    refused over a pending decision is an ``error``, not a paused run's ``success``."""
    if status is RunStatus.WAITING and error_code == REFUSED_OVER_A_DECISION:
        return "error"
    return SDK_RUN_STATUS[status]


@dataclass(frozen=True, slots=True)
class RunRecord:
    """The protocol's record of a run (a Redis hash, ``protocol_run_key``): what the protocol adds
    to a run, and its webhook's delivery (shared/contracts/webhooks.py)."""

    metadata: dict[str, Any]
    stream_mode: tuple[str, ...]
    multitask_strategy: str = "reject"
    webhook: str | None = None
    #: ``pending`` (enqueued), ``delivered`` or ``failed``; None before the run ends
    webhook_outcome: str | None = None
    webhook_attempts: int = 0
    webhook_last_status: str | None = None
    webhook_delivered_at: str | None = None
    #: the assistant the run was made with (its id; the default's when the record predates it)
    assistant_id: str = ASSISTANT_ID

    @classmethod
    def parse(cls, fields: dict[str, str]) -> RunRecord:
        try:
            metadata = msgspec.json.decode(fields.get("metadata") or "{}")
            modes = msgspec.json.decode(fields.get("stream_mode") or "[]")
        except msgspec.DecodeError:
            metadata, modes = {}, []
        return cls(
            metadata if isinstance(metadata, dict) else {}, tuple(modes) or DEFAULT_STREAM_MODES,
            fields.get("multitask_strategy") or "reject",
            webhook=fields.get("webhook") or None,
            webhook_outcome=fields.get("webhook_outcome") or None,
            webhook_attempts=int(fields.get("webhook_attempts") or 0),
            webhook_last_status=fields.get("webhook_last_status") or None,
            webhook_delivered_at=fields.get("webhook_delivered_at") or None,
            assistant_id=fields.get("assistant_id") or ASSISTANT_ID,
        )

    def webhook_state(self) -> dict[str, Any] | None:
        """The delivery as a run shows it (the URL without its query: it may hold a secret)."""
        if self.webhook is None:
            return None
        # Here, not at the top: webhooks imports Redis, arq and httpx, which the API's reader
        # processes (that import this module for ``values_of``) never need (bench figure 16).
        from shared.contracts.webhooks import shown

        return {
            "url": shown(self.webhook), "outcome": self.webhook_outcome or "not_ended",
            "attempts": self.webhook_attempts, "last_status": self.webhook_last_status,
            "delivered_at": self.webhook_delivered_at,
        }


def plain(value: Any) -> Any:
    """JSON-ready: what JSON cannot hold (a datetime in a model's metadata) becomes text."""
    return json.loads(json.dumps(value, default=str))


def message_dict(message: BaseMessage) -> dict[str, Any]:
    """A message as the Agent Server sends it: LangChain's fields, ``type`` human/ai/tool."""
    return dict(plain(message.model_dump()))


def values_of(state: StateSnapshot) -> dict[str, Any]:
    from langchain_core.messages import BaseMessage

    values: Mapping[str, Any] = state.values if isinstance(state.values, Mapping) else {}
    if not values:
        return {}
    messages = [m for m in values.get("messages") or [] if isinstance(m, BaseMessage)]
    return {"messages": [message_dict(m) for m in messages]}


def sdk_run(
    *, run_id: str, thread_id: str, status: RunStatus, created_at: str | None, started_at: str | None,
    finished_at: str | None, metadata: dict[str, Any], multitask_strategy: str, stream_mode: tuple[str, ...],
    webhook: dict[str, Any] | None = None, error_code: str | None = None,
    assistant_id: str = ASSISTANT_ID,
) -> dict[str, Any]:
    """The SDK's ``Run``; with ``webhook`` (its delivery) when the run has one."""
    created = created_at or started_at
    run: dict[str, Any] = {
        "run_id": run_id,
        "thread_id": thread_id,
        "assistant_id": assistant_id,
        "created_at": created,
        "updated_at": finished_at or started_at or created,
        "status": sdk_status(status, error_code),
        "metadata": metadata,
        "multitask_strategy": multitask_strategy,
        "kwargs": {"stream_mode": list(stream_mode)},
    }
    if webhook is not None:
        run["webhook"] = webhook
    return run
