"""Users and their keys: made and revoked by ``sophos users`` (which writes the database
itself, no service running), looked up by the API on each request (api/auth/keys.py).

A key is shown once, when it is made, and only its SHA-256 digest is stored: a key is 32
random bytes, so a plain digest cannot be searched back (a slow password hash buys nothing
for a secret nobody chose), and the API finds a key's user with one indexed lookup. A revoked
user keeps their row: their name still owns what they made and is never given to anyone else.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from shared.errors import BadRequest, NotFound, UserExists
from shared.settings_parsing import USER_NAME
from shared.storage import Database
from shared.storage.schema import now_iso

#: the user of an API without identities, who owns what was stored before them
LOCAL_USER = "local"
#: the identity ``API_TOKEN`` presents (an operator)
TOKEN_USER = "api-token"  # noqa: S105  a name, not a secret
#: names no key can be made for: they name identities that are not users
RESERVED = frozenset({LOCAL_USER, TOKEN_USER})
#: the migration that made the users table (shared/storage/schema.py)
USERS_MIGRATION = 10
#: what starts every key: tells a key from a JWT (which has two dots) and from API_TOKEN
KEY_PREFIX = "sk-sophos-"


class Reads(Protocol):
    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...


@dataclass(frozen=True, slots=True)
class User:
    name: str
    operator: bool
    created_at: str
    revoked_at: str | None = None


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()


def check_name(name: str) -> str:
    if not USER_NAME.fullmatch(name):
        raise BadRequest(f"not a user name (letters, digits and ._@|:+-, at most 128): {name[:140]!r}")
    if name in RESERVED:
        named = "the local user" if name == LOCAL_USER else "API_TOKEN"
        raise BadRequest(f"{name!r} is reserved: it names {named}")
    return name


async def add_user(db: Database, name: str, *, operator: bool = False) -> str:
    """Make ``name`` a user (or give a revoked one a new key); the key, to be shown once."""
    check_name(name)
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    async with db.transaction() as tx:
        existing = await tx.fetchall("SELECT revoked_at FROM users WHERE name = ?", (name,))
        if existing and existing[0][0] is None:
            raise UserExists(f"user {name!r} already exists: revoke its key first to give it a new one")
        if existing:
            await tx.execute(
                "UPDATE users SET key_digest = ?, operator = ?, created_at = ?, revoked_at = NULL "
                "WHERE name = ?",
                (key_digest(key), int(operator), now_iso(), name),
            )
        else:
            await tx.execute(
                "INSERT INTO users (name, key_digest, operator, created_at) VALUES (?, ?, ?, ?)",
                (name, key_digest(key), int(operator), now_iso()),
            )
    return key


async def revoke_user(db: Database, name: str) -> None:
    async with db.transaction() as tx:
        changed = await tx.execute(
            "UPDATE users SET revoked_at = ? WHERE name = ? AND revoked_at IS NULL", (now_iso(), name)
        )
    if not changed:
        raise NotFound(f"no user {name!r} with a key in force")


async def list_users(db: Reads) -> list[User]:
    rows = await db.fetchall("SELECT name, operator, created_at, revoked_at FROM users ORDER BY name")
    return [User(r[0], bool(r[1]), r[2], r[3]) for r in rows]


async def user_of_key(db: Reads, key: str) -> User | None:
    """The user whose key ``key`` is, unless revoked."""
    rows = await db.fetchall(
        "SELECT name, operator, created_at FROM users WHERE key_digest = ? AND revoked_at IS NULL",
        (key_digest(key),),
    )
    return User(rows[0][0], bool(rows[0][1]), rows[0][2]) if rows else None


async def keys_in_force(db: Reads) -> bool:
    """True once any user was ever made: from then on a request needs a credential (revoking
    the last user must not open the API)."""
    return bool(await db.fetchall("SELECT 1 FROM users LIMIT 1"))


async def adopt(db: Database, owner: str) -> int:
    """Hand what the local user owns (what was stored before identities) to ``owner``
    (AUTH_ADOPT_OWNER), at a worker's start-up; how many conversations moved. Harmless to
    repeat: once handed over, nothing is the local user's any more."""
    async with db.transaction() as tx:
        moved = await tx.execute("UPDATE conversations SET owner = ? WHERE owner = ?", (owner, LOCAL_USER))
        await tx.execute("UPDATE runs SET owner = ? WHERE owner = ?", (owner, LOCAL_USER))
        await tx.execute("UPDATE crons SET owner = ? WHERE owner = ?", (owner, LOCAL_USER))
    return moved
