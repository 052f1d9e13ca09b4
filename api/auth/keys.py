"""Users' keys as the API checks them: one indexed lookup, remembered for under a second.

``sophos users revoke`` writes the database, which every API process reads: a revoked key is
refused on every process once its remembered answer is older than :data:`REMEMBER_SECONDS`
(DESIGN.md: "within a second"). Answers are remembered by the key's digest, found or not, so
a burst of requests with one key costs one lookup, and a flood of wrong keys costs one each.
"""

from __future__ import annotations

import time
from collections import OrderedDict

from shared.storage.reading import Reader
from shared.users import USERS_MIGRATION, User, key_digest, keys_in_force, user_of_key

REMEMBER_SECONDS = 0.5
#: digests remembered at most (oldest forgotten first): a flood of wrong keys stays bounded
REMEMBERED = 4096


class KeyDirectory:
    def __init__(self, db: Reader, *, remember: float = REMEMBER_SECONDS) -> None:
        self.db = db
        self.remember = remember
        self._answers: OrderedDict[str, tuple[float, User | None]] = OrderedDict()
        self._in_force: tuple[float, bool] | None = None

    async def in_force(self) -> bool:
        """True once a user exists: every request then needs a credential. Once true it stays
        true for this process (users are never deleted), so only a 'no' is asked again."""
        now = time.monotonic()
        if self._in_force is not None and (self._in_force[1] or now - self._in_force[0] < self.remember):
            return self._in_force[1]
        version = await self.db.schema_version()
        # Before the workers made the users table, no user can exist.
        answer = version is not None and version >= USERS_MIGRATION and await keys_in_force(self.db)
        self._in_force = (now, answer)
        return answer

    async def user(self, key: str) -> User | None:
        """The user of ``key`` (None: no such key, or revoked)."""
        if not await self.in_force():
            return None
        digest = key_digest(key)
        now = time.monotonic()
        seen = self._answers.get(digest)
        if seen is not None and now - seen[0] < self.remember:
            return seen[1]
        user = await user_of_key(self.db, key)
        self._answers[digest] = (now, user)
        self._answers.move_to_end(digest)
        while len(self._answers) > REMEMBERED:
            self._answers.popitem(last=False)
        return user
