"""Latencies of model and tool calls, taken from LangChain's callbacks.

A :class:`CallTimer` rides in the config of a run's ``astream``: LangChain calls
it when a chat model or a tool starts and ends (tools through ToolNode inherit
the run's callbacks), and it notes each duration in a :class:`MetricBatch`. The
run service writes the batch to Redis at step boundaries and at the run's end,
so timing costs no round trip of its own (see shared/metrics.py).
"""

from __future__ import annotations

import time
from typing import Any
from uuid import UUID

from langchain_core.callbacks import AsyncCallbackHandler

from shared.metrics import MODEL_CALL, TOOL_CALL, MetricBatch


class CallTimer(AsyncCallbackHandler):
    def __init__(self, batch: MetricBatch) -> None:
        self.batch = batch
        self._model: dict[UUID, float] = {}
        self._tools: dict[UUID, tuple[str, float]] = {}

    async def on_chat_model_start(
        self, serialized: dict[str, Any], messages: Any, *, run_id: UUID, **kwargs: Any
    ) -> None:
        self._model[run_id] = time.monotonic()

    async def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._model_done(run_id)

    async def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._model_done(run_id)

    def _model_done(self, run_id: UUID) -> None:
        started = self._model.pop(run_id, None)
        if started is not None:
            self.batch.observe(MODEL_CALL, time.monotonic() - started)

    async def on_tool_start(
        self, serialized: dict[str, Any], input_str: str, *, run_id: UUID, **kwargs: Any
    ) -> None:
        name = str((serialized or {}).get("name") or kwargs.get("name") or "unknown")
        self._tools[run_id] = (name, time.monotonic())

    async def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._tool_done(run_id)

    async def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._tool_done(run_id)

    def _tool_done(self, run_id: UUID) -> None:
        started = self._tools.pop(run_id, None)
        if started is not None:
            name, at = started
            self.batch.observe(TOOL_CALL, time.monotonic() - at, {"tool": name})
