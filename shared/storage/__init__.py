"""The application's database, on SQLite (the default) or PostgreSQL (``DATABASE_URL``).

One query layer speaks both: the application's SQL is written once, with ``?`` for its
parameters, in the portable subset both engines run (``ON CONFLICT``, row values,
``COALESCE``, partial indexes); :class:`Database` runs it on either. What only one engine
has lives in its module: the SQLite file's connection settings (:mod:`.sqlite`), and the
PostgreSQL pools, the saver's lock and the lease that fences every write of a run
(:mod:`.postgres`). The checkpoints are LangGraph's savers on either side. Which engine
the settings name is asked in one place, :mod:`.engines`, which opens the worker's
database and saver and the API's read-only :mod:`.reading` view.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Literal, Protocol

Dialect = Literal["sqlite", "postgresql"]


class CheckpointDecodeError(Exception):
    """The serializer could not decode a stored checkpoint or write (damaged, or refused).

    Raised by the reader processes' serializer (:mod:`.threads.decoding`), caught by the API
    (api/store.py), which must not load LangGraph to name it: so it lives here.
    """


class Tx(Protocol):
    """Statements inside one transaction."""

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run ``sql``; return how many rows it changed."""
        ...

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...


class Database(Protocol):
    """The application tables' connection(s): reads, and transactions that commit or roll back whole."""

    dialect: Dialect
    #: True when many workers write (PostgreSQL): each run is leased to one of them, and every
    #: write of a run is fenced by its lease (shared/storage/postgres.py). False when one worker
    #: writes (SQLite: the file's writer lock is the only owner).
    leases: bool

    def transaction(self) -> AbstractAsyncContextManager[Tx]: ...

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...

    async def close(self) -> None: ...


def is_database_unavailable(exc: BaseException) -> bool:
    """True when ``exc`` (or what caused it) says the database cannot be written now.

    SQLite locked past the busy timeout, disk full, I/O errors (``sqlite3.OperationalError``);
    PostgreSQL unreachable or its connection lost (``psycopg.OperationalError``, or the server
    ending a transaction left idle past a lease: shared/storage/postgres.py), or no pool
    connection in time. Constraint violations and the like are bugs, not unavailability.
    """
    import sqlite3

    import psycopg
    import psycopg_pool

    unavailable = (
        sqlite3.OperationalError, psycopg.OperationalError,
        psycopg.errors.IdleInTransactionSessionTimeout, psycopg_pool.PoolTimeout,
    )
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, unavailable):
            return True
        current = current.__cause__ or current.__context__
    return False
