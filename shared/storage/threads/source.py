"""Where a reader process reads threads, and how: what :meth:`api.store.Store.read_thread` sends.

Its own module, importing only the standard library at the top: a reader process unpickles a
:class:`ThreadSource` with each read, which imports this module, and should load no more than
the read needs (shared/storage/reading.py, the API's side, imports aiosqlite, anyio and
structlog). :meth:`ThreadSource.read` opens LangGraph's saver for the engine, the one way the
API reads checkpoints (DESIGN.md, "Layout"; on PostgreSQL one whose listing fetches a stored
full copy of the messages only when it is read: shared/storage/threads/listing.py), and turns the
engine's errors into DATABASE_UNAVAILABLE.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from shared.errors import DatabaseUnavailable
from shared.storage import Dialect

if TYPE_CHECKING:
    from langgraph.checkpoint.base import BaseCheckpointSaver
    from langgraph.checkpoint.serde.base import SerializerProtocol

T = TypeVar("T")


def unavailable(exc: BaseException) -> DatabaseUnavailable:
    """The engine's error ``exc`` as DATABASE_UNAVAILABLE."""
    return DatabaseUnavailable(f"the database cannot be read: {exc}")


@dataclass(frozen=True, slots=True)
class ThreadSource:
    """Where a reader process reads threads: a SQLite file's read-only URI, or a PostgreSQL URL."""

    dialect: Dialect
    address: str

    def read(self, read: Callable[[BaseCheckpointSaver[Any]], T]) -> T:
        """``read(saver)`` on a connection of its own (synchronous: a reader process's), with
        the strict serializer that decodes each stored blob once (shared/storage/threads/decoding.py).

        The engine's errors, opening or reading, are DATABASE_UNAVAILABLE; anything else
        ``read`` raises (a checkpoint that cannot be decoded) passes through as it is.
        """
        from shared.storage.threads.decoding import DecodedOnce

        serde = DecodedOnce()
        if self.dialect == "sqlite":
            return self._read_sqlite(serde, read)
        return self._read_postgres(serde, read)

    def _read_sqlite(self, serde: SerializerProtocol, read: Callable[[BaseCheckpointSaver[Any]], T]) -> T:
        from langgraph.checkpoint.sqlite import SqliteSaver

        try:
            conn = sqlite3.connect(self.address, uri=True, timeout=5.0, check_same_thread=False)
        except sqlite3.Error as exc:
            raise unavailable(exc) from exc
        with contextlib.closing(conn):
            try:
                return read(SqliteSaver(conn, serde=serde))
            except sqlite3.Error as exc:
                raise unavailable(exc) from exc

    def _read_postgres(self, serde: SerializerProtocol, read: Callable[[BaseCheckpointSaver[Any]], T]) -> T:
        import psycopg
        from psycopg.rows import dict_row

        from shared.storage.threads.listing import LazyPostgresSaver

        try:
            conn = psycopg.connect(self.address, autocommit=True, prepare_threshold=0, row_factory=dict_row)
        except psycopg.Error as exc:
            raise unavailable(exc) from exc
        with conn:
            try:
                return read(LazyPostgresSaver(conn, serde=serde))
            except psycopg.Error as exc:
                raise unavailable(exc) from exc
