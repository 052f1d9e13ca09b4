"""A PostgreSQL thread's checkpoints listed in time linear in the thread (issue 44).

LangGraph's ``PostgresSaver.list`` fetches, with every checkpoint it lists, every value stored for
the channels it names: among them the full copies of the messages a ``DeltaChannel`` stores
every ``SNAPSHOT_FREQUENCY`` updates, each of the whole list so far, which the reader's serializer
then does not decode (shared/storage/threads/decoding.py) and the JSON Lines export mostly does
not read (shared/storage/threads/history.py ``path``). Their bytes grow with the square of the
thread, and the saver's query joins each checkpoint with all of the thread's stored values
(bench/RESULTS.md, figure 24's listing: 3,000 checkpoints 6.3 s where SQLite took 0.95).

:class:`LazyPostgresSaver` lists the same checkpoints, the same tuples, but reads a full copy
only when its value is read: the tuple holds a ``_DeltaSnapshot`` whose length is read from the
copy's first bytes and whose value is fetched, then decoded, on first access. Every other value
is fetched with the listing, as the saver fetches it. How LangGraph's tables are read is
shared/compat.py's (``postgres_listing``), tests/fast/test_compat.py fails when they change;
tests/test_postgres_listing.py compares the tuples with the saver's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from langgraph.checkpoint.base import CheckpointTuple
from langgraph.checkpoint.postgres import PostgresSaver

from shared.compat import (
    DeltaSnapshot,
    StoredKey,
    lazy_delta_snapshot,
    postgres_listing,
    postgres_stored_value,
)
from shared.errors import DatabaseUnavailable
from shared.storage import CheckpointDecodeError
from shared.storage.threads.decoding import snapshot_head

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig


class LazyPostgresSaver(PostgresSaver):
    """``PostgresSaver`` (for reading) whose ``list`` fetches a stored full copy of a channel
    only when its value is read."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # One object per stored copy, as the reader's serializer gives one per blob decoded: a
        # copy shared by checkpoints (a step that wrote no message) is fetched at most once.
        self._copies: dict[StoredKey, Any] = {}
        #: the copies fetched (their values read)
        self.fetched = 0

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        listed = postgres_listing(self, config, filter=filter, before=before, limit=limit, wanted=_read_now)
        if listed is None:
            # Whole before the first is given: the saver's own yields with its lock held, which
            # a copy listed before, read meanwhile, would wait for forever.
            yield from list(super().list(config, filter=filter, before=before, limit=limit))
            return
        for saved, left in listed:
            for channel, (key, kind, head) in left.items():
                saved.checkpoint["channel_values"][channel] = self._copy(key, kind, head)
            yield saved

    def _copy(self, key: StoredKey, kind: str, head: bytes | None) -> Any:
        if key not in self._copies:
            _, length = snapshot_head(kind, head)
            self._copies[key] = lazy_delta_snapshot(lambda: self._fetch(key), length)
        return self._copies[key]

    def _fetch(self, key: StoredKey) -> Any:
        """The value of the copy stored under ``key``, fetched and decoded."""
        stored = postgres_stored_value(self, key)
        if stored is None or stored[1] is None:
            # Deleted since it was listed (the thread pruned meanwhile): the read is stale.
            gone = f"{key[2]} {key[3]} is gone"
            raise DatabaseUnavailable(f"the thread changed while it was read ({gone}): read it again")
        self.fetched += 1
        copy = self.serde.loads_typed((stored[0], stored[1]))
        if not isinstance(copy, DeltaSnapshot):
            raise CheckpointDecodeError(f"the stored copy {key[2]} {key[3]} is a {type(copy).__name__}")
        return copy.value


def _read_now(kind: str, head: bytes | None) -> bool:
    """Whether the listing reads a stored value with the checkpoint: all but a full copy."""
    return not snapshot_head(kind, head)[0]
