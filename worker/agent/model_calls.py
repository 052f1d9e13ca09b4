"""Model calls repeated by a resume: counted for ``/metrics``, never prevented.

A model call is *repeated by a resume* when the resume makes it for a step whose model call an
earlier run had already started, and whose output (whole, or the part streamed so far) was lost
with that run: the worker died while the model answered, or after it answered but before
LangGraph saved the step's writes (``put_writes`` runs in the background, langgraph#8039). A
step whose writes were saved is not run again, so it is never counted; nor is a call that
failed (the model unreachable, say), since it produced nothing.

A step is known by its LangGraph task id (the ``agent:<id>`` of the node's checkpoint
namespace), which is derived from the checkpoint it runs from and is the same on every
resume of that step. Before each model call the worker swaps it into the conversation's
:func:`shared.redis.keys.model_call_key` (one Redis ``SET ... GET``, no extra database write):
finding the same task id there means the call is made again. A call that fails takes its
mark back. The mark lives as long as a run may wait to be resumed (``MODEL_CALL_MARK_TTL``);
like every metric it is a view in Redis, never a reason to fail a run.
"""

from __future__ import annotations

from typing import Any

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

from shared.redis.keys import MODEL_CALL_MARK_TTL, model_call_key
from shared.redis.metrics import MODEL_CALLS_REPEATED
from worker.metrics import counted

log = structlog.get_logger(__name__)


def step_of(config: Any) -> tuple[str, str] | None:
    """(conversation, task id) of the node running with ``config``; None outside a thread."""
    conversation = str(config.get("configurable", {}).get("thread_id") or "")
    namespace = str(config.get("metadata", {}).get("langgraph_checkpoint_ns") or "")
    task = namespace.rpartition(":")[2]
    return (conversation, task) if conversation and task else None


class ModelCalls:
    """The marks of model calls started, in Redis."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis

    async def starting(self, config: Any) -> None:
        """Mark the model call about to be made; count it if its step's call was made before."""
        step = step_of(config)
        if step is None:
            return
        conversation, task = step
        try:
            key = model_call_key(conversation)
            before = await self.redis.set(key, task, ex=MODEL_CALL_MARK_TTL, get=True)
        except RedisError as exc:
            log.warning("model_call.mark_failed", error=str(exc))
            return
        if before is not None and (before.decode() if isinstance(before, bytes) else before) == task:
            log.warning("model_call.repeated", task=task)
            counted(MODEL_CALLS_REPEATED)

    async def failed(self, config: Any) -> None:
        """The call produced nothing: a resume making it again repeats nothing."""
        step = step_of(config)
        if step is None:
            return
        try:
            await self.redis.delete(model_call_key(step[0]))
        except RedisError as exc:
            log.warning("model_call.mark_failed", error=str(exc))
