"""The ISO-8601 UTC timestamps the worker writes, and durations between them."""

from __future__ import annotations

from datetime import datetime

from shared.storage.schema import iso_from_timestamp

__all__ = ["iso_from_timestamp", "millis_between", "parse_iso"]


def parse_iso(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def millis_between(start: str | datetime | None, end: str | datetime | None) -> int | None:
    a = parse_iso(start) if isinstance(start, str) or start is None else start
    b = parse_iso(end) if isinstance(end, str) or end is None else end
    if a is None or b is None:
        return None
    return max(0, round((b - a).total_seconds() * 1000))
