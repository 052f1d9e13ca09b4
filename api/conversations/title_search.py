"""Searching conversations by title: a case-insensitive substring, the same on both engines.

The query's ``%``, ``_`` and ``\\`` are matched as themselves (escaped for ``LIKE``). On
PostgreSQL ``ILIKE`` folds case; SQLite's ``LIKE`` folds only ASCII letters, so its reader
connection has ``sophos_fold`` (Python's ``str.casefold``, registered in
shared/storage/reading.py) applied to both sides: "É" finds "école" there too. Conversations
known only from Redis (their first run is queued) are matched in Python the same way.
"""

from __future__ import annotations

from shared.storage import Dialect
from shared.storage.reading import FOLD_FUNCTION

_CONDITION: dict[str, str] = {
    "sqlite": f"{FOLD_FUNCTION}(c.title) LIKE ? ESCAPE '\\'",
    "postgresql": "c.title ILIKE ? ESCAPE '\\'",
}


def fold(text: str) -> str:
    return text.casefold()


def condition(dialect: Dialect) -> str:
    """The SQL condition on ``c.title``, with one parameter: :func:`pattern`'s."""
    return _CONDITION[dialect]


def pattern(query: str, dialect: Dialect) -> str:
    escaped = query.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{fold(escaped) if dialect == 'sqlite' else escaped}%"


def matches(title: str, query: str) -> bool:
    return fold(query) in fold(title)
