"""Searching and counting threads (``POST /threads/search`` and ``/threads/count``): the
conversations and the threads created empty, looked at together up to :data:`SEARCH_SCAN` of each."""

from __future__ import annotations

from typing import Any

from api.auth.scope import visible
from api.conversations.views import queued_only, summary
from api.protocol.status import THREAD_STATUSES
from api.protocol.threads.bodies import (
    ThreadSearch,
    thread_id_of,
)
from api.protocol.threads.found import Found, interrupts_by_task
from api.protocol.threads.records import Record
from api.protocol.threads.service import Threads
from api.runs import live
from api.store import ConversationRow
from shared.errors import BadRequest, NotFound
from shared.redis.keys import PROTOCOL_THREADS, protocol_thread_key

#: a search looks at most at this many conversations (newest first) and threads created empty
SEARCH_SCAN = 5000
_PAGE = 500
SEARCH_LIMIT_MAX = 1000


def _matches(found: Found, query: ThreadSearch) -> bool:
    if query.status is not None and found.status != query.status:
        return False
    metadata = found.metadata
    return all(metadata.get(k) == v for k, v in (query.metadata or {}).items())


async def count(threads: Threads, query: ThreadSearch) -> int:
    """How many threads ``query`` matches (``metadata``, ``status``, ``ids``; up to
    :data:`SEARCH_SCAN` of each kind, as a search looks at)."""
    return len([f for f in await _filtered(threads, query) if _matches(f, query)])


async def _filtered(threads: Threads, query: ThreadSearch) -> list[Found]:
    """The threads a search or a count looks at (``ids``, else all), its filters checked."""
    if query.values or query.extract or query.select:
        raise BadRequest("values, select and extract are not served by Sophos (docs/agent-protocol.md)")
    if query.status is not None and query.status not in THREAD_STATUSES:
        raise BadRequest(f"status must be one of {', '.join(sorted(THREAD_STATUSES))}")
    if query.ids is not None:
        ids = [thread_id_of(i) for i in query.ids]
        return [f for f in [await _maybe(threads, i) for i in dict.fromkeys(ids)] if f is not None]
    return await _all(threads)


async def search(threads: Threads, query: ThreadSearch) -> list[dict[str, Any]]:
    if not 1 <= query.limit <= SEARCH_LIMIT_MAX or query.offset < 0:
        raise BadRequest(f"limit must be 1 to {SEARCH_LIMIT_MAX} and offset at least 0")
    sort_by = query.sort_by or "created_at"
    if sort_by not in ("created_at", "updated_at", "thread_id", "status"):
        raise BadRequest("sort_by must be thread_id, status, created_at or updated_at")
    if query.sort_order not in (None, "asc", "desc"):
        raise BadRequest("sort_order must be asc or desc")
    found = await _filtered(threads, query)
    matched = [(f, f.shape()) for f in found if _matches(f, query)]
    matched.sort(
        key=lambda m: (m[1][sort_by] or "", m[1]["thread_id"]), reverse=query.sort_order != "asc"
    )
    # Each thread with its values, as the Agent Server answers (a UI titles a thread by its
    # first message): one state read per thread of the page, never of the whole scan, one
    # after the other (a read's timeout counts its wait for a reader: api/http/readers.py).
    page = []
    for found_one, _ in matched[query.offset : query.offset + query.limit]:
        state = await threads.state_of(found_one)
        page.append(found_one.shape(state["values"], interrupts_by_task(state)))
    return page


async def _maybe(threads: Threads, thread_id: str) -> Found | None:
    try:
        return await threads.find(thread_id)
    except NotFound:
        return None


async def _all(threads: Threads) -> list[Found]:
    """Every thread, up to :data:`SEARCH_SCAN` of each kind, newest first."""
    claims = await live.active_runs(threads.redis)
    rows: list[ConversationRow] = []
    before: tuple[str, str] | None = None
    while len(rows) < SEARCH_SCAN:
        page = await threads.store.conversations(limit=_PAGE, before=before)
        rows += page
        if len(page) < _PAGE:
            break
        before = (page[-1].created_at, page[-1].id)
    active = await threads.store.runs_by_id([claims[r.id] for r in rows if r.id in claims])
    record_ids: list[str] = await threads.redis.zrevrange(PROTOCOL_THREADS, 0, SEARCH_SCAN - 1)
    async with threads.redis.pipeline(transaction=False) as pipe:
        for thread_id in record_ids:
            pipe.hgetall(protocol_thread_key(thread_id))
        replies = await pipe.execute()
    parsed = (Record.parse(i, f) for i, f in zip(record_ids, replies, strict=True))
    records = {r.id: r for r in parsed if r is not None and visible(r.owner)}
    found: dict[str, Found] = {}
    for row in rows:
        claim = claims.get(row.id)
        info = summary(row, claim, active.get(claim) if claim is not None else None)
        found[row.id] = Found(row.id, records.get(row.id), info)
    # Threads with no conversation row: empty, or their first run still queued.
    waiting = [i for i in records if i not in found and i in claims]
    described = await live.described_runs(threads.redis, [claims[i] for i in waiting])
    for thread_id, record in records.items():
        if thread_id in found:
            continue
        queued = described.get(claims.get(thread_id, ""))
        if queued is None and thread_id in claims:
            continue  # being recorded by the worker right now: listed next time
        found[thread_id] = Found(thread_id, record, queued_only(queued) if queued is not None else None)
    return list(found.values())
