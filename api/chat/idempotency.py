"""Replaying the first answer to a ``POST /api/chat`` with an ``Idempotency-Key``: the key checked
and the request fingerprinted, the first answer looked up and given again.

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

import hashlib
import json
import re
from typing import Any

import structlog
from redis.asyncio import Redis

from api.auth.identity import caller
from api.chat.schemas import ChatAccepted, ChatRequest
from shared.errors import BadRequest, IdempotencyKeyReused, NotFound
from shared.redis.keys import conversation_deleted_key
from shared.redis.queue import FirstAnswer, Idempotency
from shared.redis.queue import first_answer as stored_answer

log = structlog.get_logger(__name__)


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


#: Visible ASCII, as the header's draft standard suggests (a UUID fits easily).
_IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,255}")


def idempotency_of(key: str | None, request: ChatRequest, conversation_id: str | None) -> Idempotency | None:
    """The request's idempotency key, checked, with a fingerprint of what it asks for."""
    if key is None:
        return None
    if not _IDEMPOTENCY_KEY.fullmatch(key):
        raise BadRequest("Idempotency-Key must be 1 to 255 visible ASCII characters")
    fields: list[Any] = [request.message, conversation_id, request.resume]
    if request.decisions is not None:  # a message or resume fingerprints as it always did
        fields.append([[d.id, d.action, d.arguments, d.message] for d in request.decisions])
    if request.replaces is not None or request.regenerate is not None:
        fields.append(["fork", request.replaces, request.regenerate])
    asked = json.dumps(fields, ensure_ascii=False)
    # A key is its user's: another user's same key is another key (and reveals nothing).
    return Idempotency(key, hashlib.sha256(asked.encode()).hexdigest(), owner=caller().name)


async def replay(redis: Redis, idempotency: Idempotency | None) -> ChatAccepted | None:
    """The first answer to the request this retries (None: no key, or no answer yet); a key used
    for a different request is IdempotencyKeyReused, a deleted conversation's is NotFound."""
    if idempotency is None:
        return None
    first = await first_answer(redis, idempotency)
    return answer(first, idempotency) if first else None


def answer(first: FirstAnswer, idempotency: Idempotency) -> ChatAccepted:
    if first.fingerprint != idempotency.fingerprint:
        raise IdempotencyKeyReused(
            "this Idempotency-Key was already used for a different request; use a new key"
        )
    log.info("run.idempotent_replay", run_id=first.run)
    return ChatAccepted(conversation=first.conversation, run=first.run)
