"""What the caller may see, as the storage layer applies it: the one place that compares owners.

Every read of a user's data filters by the caller bound for the request (api/auth/identity.py):
the API's store adds :func:`owned` to its SQL, and what only Redis knows (a queued run, a
thread created empty) is kept with its owner and passed through :func:`visible`; the Store's
items are kept under their owner's namespace (:func:`store_namespace`). Handlers never
compare owners themselves. What a caller may not see is as absent as what does not exist: 404,
never 403, so its existence is not revealed.
"""

from __future__ import annotations

from collections.abc import Sequence

from api.auth.identity import caller
from shared.storage.memory import owner_label


def owned(column: str = "owner") -> tuple[str, tuple[str, ...]]:
    """A SQL condition on ``column`` keeping only the caller's rows (``1 = 1`` for an operator),
    and its parameters."""
    who = caller()
    if who.operator:
        return "1 = 1", ()
    return f"{column} = ?", (who.name,)


def visible(owner: str | None) -> bool:
    """May the caller see what ``owner`` owns? (None: an owner not recorded: operators only.)"""
    who = caller()
    return who.operator or (owner is not None and owner == who.name)


def only_owner() -> str | None:
    """The one owner whose things the caller may see; None for an operator (everyone's)."""
    who = caller()
    return None if who.operator else who.name


def sees_everything() -> bool:
    """True for an operator (and the local user): no filter applies."""
    return caller().operator


def owner_for_new() -> str:
    """Who owns what the caller makes now (a conversation, a thread, a cron): the caller."""
    return caller().name


def active_run_limit(user_limit: int) -> int:
    """How many runs the caller may have queued or running at once (DESIGN.md "Fair shares"):
    ``user_limit`` for a user; 0, no limit, for an operator, whose runs are counted, not limited."""
    return 0 if caller().operator else user_limit


def store_namespace(namespace: Sequence[str]) -> tuple[str, ...]:
    """The Store's namespace as stored: the caller's own label, then what the caller names.

    Every identity's items live under its own label (shared/storage/memory.py), operators' too
    (a namespace names no owner, so an operator cannot name another user's), and every read is
    confined to it: another user's items are as absent as what does not exist.
    """
    return (owner_label(caller().name), *namespace)


def store_namespace_shown(stored: Sequence[str]) -> list[str]:
    """A stored namespace as its owner named it: without the owner's label."""
    return list(stored[1:])

