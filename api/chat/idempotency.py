"""Replaying the first answer to a ``POST /api/chat`` with an ``Idempotency-Key``.

A retried request gets the first request's answer (same conversation, same run) for
``IDEMPOTENCY_TTL_SECONDS``, unless that conversation was deleted since: deleted means
gone, so the retry is answered 404 NOT_FOUND, as a request naming the conversation
would be. It does not start anything either: for a message to an existing
conversation there is nothing left to add it to, and for a request that created the
conversation, acting on it again would run the same message twice (the client deleted
what it made; a new conversation needs a new key). The delete leaves a mark for as
long as the answers it outlives (``conversation_deleted_key``), because the answers
are kept per key, not per conversation.
"""

from __future__ import annotations

from redis.asyncio import Redis

from shared.errors import NotFound
from shared.redis.keys import conversation_deleted_key
from shared.redis.queue import FirstAnswer, Idempotency
from shared.redis.queue import first_answer as stored_answer


async def first_answer(redis: Redis, idempotency: Idempotency) -> FirstAnswer | None:
    """The answer already given to a request with this key, if any; NotFound if its conversation is deleted.

    A key used for a different request is returned as it is, so the caller refuses it
    (422) whatever became of the conversation it names.
    """
    first = await stored_answer(redis, idempotency)
    if first is None or first.fingerprint != idempotency.fingerprint:
        return first
    if await redis.exists(conversation_deleted_key(first.conversation)):
        raise NotFound(
            f"conversation {first.conversation}, named by this Idempotency-Key's first answer, "
            "has been deleted"
        )
    return first
