"""A run of kind ``update``: the Agent Protocol's ``update_state`` (``POST /threads/{id}/state``).

It writes the job's ``values`` into the thread as the node ``as_node`` would have (LangGraph's
``aupdate_state``: the state's reducers apply, so messages with a stored id replace it and
others are added), one checkpoint, a child of the head of the branch the conversation follows,
stamped with the run's id like every checkpoint a run writes. Nothing is sent to the model or
to a tool. The checks (the shape of ``values``, the node) were made by the API
(api/protocol/threads/updates.py); the claim of the conversation by the submission, as for any run.
"""

from __future__ import annotations

from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.graph.state import CompiledStateGraph

from shared.contracts.jobs import RunJob
from shared.storage.threads.branch import thread_at
from worker.run.publish.stream import FinalState


async def apply_update(
    graph: CompiledStateGraph[Any, Any, Any, Any], job: RunJob, config: RunnableConfig
) -> FinalState:
    """Write the update; the thread's shape after it."""
    update = job.update or {}
    await graph.aupdate_state(config, update.get("values"), as_node=update.get("as_node"))
    state = await graph.aget_state(thread_at(job.conversation_id))  # the newest: the update
    return FinalState(len((state.values or {}).get("messages", [])), pending=bool(state.tasks))
