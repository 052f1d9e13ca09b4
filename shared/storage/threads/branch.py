"""The branch a conversation follows, as the LangGraph config that reads its thread there.

A conversation's thread is a tree of checkpoints (DESIGN.md "Branches: edit and regenerate"). The
conversation follows one path of it: up from the head its row names (``conversations.branch_head``,
set by a ``switch`` run, worker/store.py), or, when the row names none, up from the thread's newest
checkpoint. After a switch back to an older branch, or a rollback, the newest checkpoints are the
branch left behind: whatever reads the conversation's state as it stands (the API's reads, a run's
ending and start-up recovery, a webhook's body, a waiting run's turn) reads it through
:func:`thread_config`, so none of them can forget the branch.

No LangGraph here: the API's main process builds the config, its reader processes read with it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

#: the head of the branch the conversation follows; NULL, or no row: the thread's newest checkpoint
BRANCH_HEAD_SQL = "SELECT branch_head FROM conversations WHERE id = ?"

#: a read of the application tables: ``Database.fetchall`` (worker), ``Store._fetch`` (API)
Fetch = Callable[[str, Sequence[Any]], Awaitable[Sequence[Sequence[Any]]]]


def thread_at(conversation_id: str, checkpoint_id: str | None = None) -> RunnableConfig:
    """The conversation's thread at ``checkpoint_id``; without one, the whole thread (its newest
    checkpoint to a state read, every checkpoint to a listing)."""
    configurable = {"thread_id": conversation_id, "checkpoint_ns": ""}
    if checkpoint_id is not None:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


async def branch_head(fetch: Fetch, conversation_id: str) -> str | None:
    """The head of the branch the conversation follows, when its row names one."""
    rows = await fetch(BRANCH_HEAD_SQL, (conversation_id,))
    return str(rows[0][0]) if rows and rows[0][0] else None


async def thread_config(fetch: Fetch, conversation_id: str) -> RunnableConfig:
    """The conversation's thread at the head of the branch it follows (``fetch`` reads its row)."""
    return thread_at(conversation_id, await branch_head(fetch, conversation_id))
