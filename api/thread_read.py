"""What a reader process runs for :meth:`api.store.Store.read_thread`: one read of one thread.

A module of its own, importing little, because a reader imports it (its functions are sent by
reference): the API's store (api/store.py) pulls in Redis, arq and the web framework's
schemas, which a reader would hold for nothing (bench figure 16).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from shared.errors import ConversationUnreadable, DatabaseUnavailable
from shared.storage import CheckpointDecodeError

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

    from shared.storage.threads.snapshot import ThreadStates
    from shared.storage.threads.source import ThreadSource

T = TypeVar("T")

if TYPE_CHECKING:
    #: what reads a thread: its states (LangGraph's ``get_state`` and ``get_state_history``, without
    #: its graph runtime: shared/storage/threads/snapshot.py) and the thread's config
    ThreadRead = Callable[[ThreadStates, RunnableConfig], T]


def hang(read: ThreadRead[T], graph: ThreadStates, config: RunnableConfig) -> T:
    """Test-only (SOPHOS_FAULT_HANG_READ): a read that never ends, as one of a huge thread would not."""
    while True:
        time.sleep(3600)


def read_thread(
    source: ThreadSource, conversation_id: str, read: ThreadRead[T], config: RunnableConfig
) -> T:
    """In a reader process: ``read`` on the conversation's thread. What fails here, short of
    the database itself (DATABASE_UNAVAILABLE), is the thread's data: this process has its own
    connection and only decodes and rebuilds the thread."""
    from shared.storage.threads.snapshot import ThreadStates

    try:
        return source.read(lambda saver: read(ThreadStates(saver), config))
    except (DatabaseUnavailable, ConversationUnreadable):
        raise
    except Exception as exc:
        raise _unreadable(conversation_id, exc) from exc


def _unreadable(conversation_id: str, exc: Exception) -> ConversationUnreadable:
    """The checkpoint serializer refused the thread's data (it never runs what it refuses)."""
    reason = str(exc) if isinstance(exc, CheckpointDecodeError) else f"{type(exc).__name__}: {exc}"
    return ConversationUnreadable(
        f"the saved state of conversation {conversation_id} cannot be read: {reason}"
    )
