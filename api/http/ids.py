"""Conversation and run ids are UUIDs; anything else is refused before any lookup."""

from __future__ import annotations

import re
import uuid

from shared.errors import BadRequest

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE)


def parse_id(value: str | None, what: str) -> str:
    """Return ``value`` as a canonical (lower-case) UUID string, or raise BadRequest."""
    if value is None or value == "":
        raise BadRequest(f"{what} is required")
    if not _UUID.fullmatch(value):
        raise BadRequest(f"{what} must be a UUID, got {value[:64]!r}")
    return value.lower()


def new_id() -> str:
    return str(uuid.uuid4())
