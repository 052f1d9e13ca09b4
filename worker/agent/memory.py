"""The agent's own memory in the Store: ``store__remember`` and ``store__recall``.

The same items the Store serves over HTTP (api/protocol/store.py), in the namespace
``["memories"]`` of the run's owner (the conversation's owner, :data:`RUN_OWNER`, set by the run
service for the run's task): what the agent remembers for Alice, Alice reads with
``client.store.search_items(["memories"])``, and no one else's run sees it. The tools are
offered beside the MCP servers' tools and called like them, through the graph's tools step and
the ledger (worker/agent/graph.py, worker/tools/ledger/): an intent before the call, the
outcome after, the outcome answered from the ledger after a crash. Both are safe to repeat (a
put of the same key and text, a read), so a call a crash left uncertain is sent again, with no
question to the user.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextvars import ContextVar

from langchain_core.tools import BaseTool, StructuredTool
from langgraph.store.base import BaseStore

from shared.storage.memory import owner_label
from worker.tools.policy import SAFE_TO_REPEAT

#: the owner of the run this task serves (worker/run/service.py sets it when a run starts)
RUN_OWNER: ContextVar[str] = ContextVar("sophos_run_owner")
#: the namespace of the agent's memories, as their owner sees it
MEMORIES = ("memories",)
#: the most a recall answers
RECALL_MAX = 50
SERVER = "store"


def _namespace() -> tuple[str, ...]:
    owner = RUN_OWNER.get(None)
    if owner is None:  # a bug, not the model's doing: every run sets it
        raise RuntimeError("no run owner: the Store's tools were called outside a run")
    return (owner_label(owner), *MEMORIES)


def memory_tools(store: BaseStore) -> list[BaseTool]:
    """The two tools on ``store``, named as MCP tools are (``server__tool``)."""

    async def remember(key: str, text: str) -> str:
        await store.aput(_namespace(), key, {"text": text})
        return f"Remembered {key!r}."

    async def recall(key: str | None = None) -> str:
        namespace = _namespace()
        if key:
            item = await store.aget(namespace, key)
            if item is None:
                return f"Nothing remembered as {key!r}."
            return f"{key}: {item.value.get('text')}"
        items = await store.asearch(namespace, limit=RECALL_MAX)
        if not items:
            return "Nothing remembered yet."
        return "\n".join(f"{item.key}: {item.value.get('text')}" for item in items)

    safe = {SAFE_TO_REPEAT: True}
    return [
        StructuredTool.from_function(
            coroutine=remember, name=f"{SERVER}__remember", metadata=safe,
            description="Remember a fact about the user for later conversations, under a short key "
                        "(the same key replaces what was remembered under it).",
        ),
        StructuredTool.from_function(
            coroutine=recall, name=f"{SERVER}__recall", metadata=safe,
            description="Recall what was remembered about the user in earlier conversations: "
                        "everything, or what is under one key.",
        ),
    ]


class WithMemory:
    """The tools now (``McpToolbox.current``) and the Store's tools after them, as one list that
    stays the same object while the MCP tools do (the graph binds the model again only when the
    list changes: worker/agent/graph.py)."""

    def __init__(self, tools: Callable[[], Sequence[BaseTool]], memory: Sequence[BaseTool]) -> None:
        self._tools = tools
        self._memory = list(memory)
        self._seen: Sequence[BaseTool] | None = None
        self._combined: list[BaseTool] = []

    def __call__(self) -> Sequence[BaseTool]:
        current = self._tools()
        if current is not self._seen:
            self._seen, self._combined = current, [*current, *self._memory]
        return self._combined
