"""The agent's Store tools and the Store's namespaces, without a process (worker/agent/memory.py,
shared/storage/memory.py): in the run owner's namespace, safe to repeat, offered beside the MCP
tools as one list; owners' labels never reach into one another."""

from __future__ import annotations

from pathlib import Path

from langchain_core.tools import BaseTool, tool
from langgraph.store.memory import InMemoryStore

from shared.storage.memory import owner_label, store_path
from worker.agent.memory import RUN_OWNER, WithMemory, memory_tools
from worker.tools.policy import safe_to_repeat


async def _as(owner: str, called: BaseTool, **arguments: str) -> str:
    """``called`` in a run of ``owner``'s (the run service sets the owner for the run's task)."""
    token = RUN_OWNER.set(owner)
    try:
        return str(await called.ainvoke(arguments))
    finally:
        RUN_OWNER.reset(token)


async def test_remember_and_recall_act_on_the_run_owners_memories() -> None:
    store = InMemoryStore()
    remember, recall = memory_tools(store)
    assert (remember.name, recall.name) == ("store__remember", "store__recall")
    assert safe_to_repeat(remember) and safe_to_repeat(recall)

    assert await _as("alice", remember, key="tea", text="green") == "Remembered 'tea'."
    item = await store.aget((owner_label("alice"), "memories"), "tea")
    assert item is not None and item.value == {"text": "green"}
    assert await _as("alice", recall) == "tea: green"
    assert await _as("alice", recall, key="tea") == "tea: green"
    assert await _as("alice", recall, key="coffee") == "Nothing remembered as 'coffee'."
    assert await _as("bob", recall) == "Nothing remembered yet."


def test_owner_labels_are_one_label_each_and_distinct() -> None:
    names = ["a", "ab", "abc", "abcdef", "a.b", "langgraph", "sub|with spaces", "ü"]
    labels = [owner_label(n) for n in names]
    assert len(set(labels)) == len(names)
    assert all("." not in label and label != "langgraph" and label for label in labels)


def test_the_sqlite_store_file_is_beside_the_database() -> None:
    assert store_path(Path("data/db/sophos.db")) == Path("data/db/sophos.store.db")


def test_the_memory_tools_come_after_the_mcp_tools_as_one_list() -> None:
    @tool
    def echo(text: str) -> str:
        """Echo."""
        return text

    mcp = [echo]
    combined = WithMemory(lambda: mcp, memory_tools(InMemoryStore()))
    first = combined()
    assert [t.name for t in first] == ["echo", "store__remember", "store__recall"]
    assert combined() is first  # the same object while the MCP tools are: the model is bound once
    mcp = [echo, echo]
    assert combined() is not first
