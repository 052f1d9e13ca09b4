"""Conversations as the API shows them: SQLite rows, live status from Redis, thread messages.

A conversation exists once its first run is accepted: until the worker starts
that run it lives only in Redis (``ACTIVE_RUNS`` and the run's ``run_key``). When
Redis is down, lists and details still come from SQLite, with SQLite's status.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import structlog
from msgspec import UNSET
from redis.asyncio import Redis

from api.auth.scope import visible
from api.chat import branches
from api.chat.approvals import pending_call, pending_requests
from api.conversations import ledger_view, title_search, transcript
from api.conversations.schemas import (
    CheckpointLine,
    ConversationDetail,
    ConversationInfo,
    ConversationList,
    ConversationSummary,
)
from api.http.timefmt import iso_from_timestamp
from api.runs.status import conversation_status, resumable, run_error
from api.runs.views import REDIS_DOWN, decode_cursor, encode_cursor, live
from api.store import ConversationRow, RunRow, Store
from shared.contracts.jobs import is_delete_claim
from shared.contracts.runs import RunStatus
from shared.errors import NotFound
from shared.redis.keys import ACTIVE_RUNS

log = structlog.get_logger(__name__)


def summary(row: ConversationRow, active: str | None, active_row: RunRow | None) -> ConversationInfo:
    """The conversation's fields; ``active`` is the run holding it (queued or running), if any."""
    status = conversation_status(row, active, active_row)
    error = None
    if active is None and row.last_status is not None:
        error = run_error(row.last_status, row.last_error_code, row.last_error_message)
    return ConversationInfo(
        id=row.id,
        title=row.title,
        created_at=row.created_at,
        updated_at=row.updated_at,
        message_count=row.message_count,
        status=status,
        error=error if error is not None else UNSET,
        resumable=resumable(row, active, status),
        owner=row.owner,
    )


def queued_only(run: live.QueuedRun) -> ConversationInfo:
    """A conversation whose first run is still queued: described by that run."""
    at = iso_from_timestamp(run.enqueued_at)
    return ConversationInfo(
        id=run.conversation_id, title=run.title, created_at=at, updated_at=at,
        message_count=0, status=RunStatus.QUEUED, resumable=False, owner=run.owner,
    )


def _key(info: ConversationInfo) -> tuple[str, str]:
    return (info.created_at, info.id)


def _as_summary(info: ConversationInfo) -> ConversationSummary:
    return ConversationSummary(
        id=info.id, title=info.title, created_at=info.created_at, updated_at=info.updated_at,
        message_count=info.message_count, status=info.status, error=info.error, owner=info.owner,
    )


@dataclass(frozen=True, slots=True)
class Conversations:
    store: Store
    redis: Redis

    async def _claims(self) -> dict[str, str] | None:
        """conversation -> active run, or None when Redis cannot say."""
        try:
            return await live.active_runs(self.redis)
        except REDIS_DOWN as exc:
            log.warning("conversations.redis_unavailable", error=str(exc))
            return None

    async def page(self, *, limit: int, cursor: str | None, query: str | None = None) -> ConversationList:
        """One page of conversations, newest created first, and the cursor of the next one.

        The key (createdAt, id) never changes, so a conversation updated while a client
        pages is neither skipped nor listed twice, and new ones only appear before the
        first page (the runs listing's approach, api/runs/views.py). A conversation whose first
        run is still queued has no row yet: it comes from its claim, with its key.
        ``query``: only the conversations whose title contains it (api/conversations/title_search.py).
        """
        before = decode_cursor(cursor) if cursor else None
        rows = await self.store.conversations(limit=limit + 1, before=before, query=query)
        try:
            claims: dict[str, str] = await self.redis.hgetall(ACTIVE_RUNS)  # type: ignore[misc]
        except REDIS_DOWN as exc:
            log.warning("conversations.redis_unavailable", error=str(exc))
            claims = {}
        # Being deleted: no longer listed.
        deleting = {conv for conv, holder in claims.items() if is_delete_claim(holder)}
        runs = {conv: holder for conv, holder in claims.items() if conv not in deleting}
        page_runs = [runs[r.id] for r in rows if r.id in runs]
        active_rows = await self.store.runs_by_id(page_runs)
        infos = [
            summary(r, runs.get(r.id), active_rows.get(runs.get(r.id, "")))
            for r in rows
            if r.id not in deleting
        ]
        unrecorded = await self._unrecorded(runs, {r.id for r in rows}, before)
        infos += [i for i in unrecorded if not query or title_search.matches(i.title, query)]
        infos.sort(key=_key, reverse=True)
        shown = infos[:limit]
        return ConversationList(
            conversations=[_as_summary(i) for i in shown],
            next_cursor=encode_cursor(_key(shown[-1])) if len(infos) > limit else None,
        )

    async def _unrecorded(
        self, runs: dict[str, str], listed: set[str], before: tuple[str, str] | None
    ) -> list[ConversationInfo]:
        """Conversations known only from their queued first run, older than ``before``."""
        candidates = [conv for conv in runs if conv not in listed]
        if not candidates:
            return []
        recorded = await self.store.existing_conversations(candidates)
        unrecorded = [runs[conv] for conv in candidates if conv not in recorded]
        if not unrecorded:
            return []
        try:
            described = await live.described_runs(self.redis, unrecorded)
        except REDIS_DOWN:
            return []
        infos = [queued_only(run) for run in described.values() if visible(run.owner)]
        return [i for i in infos if before is None or _key(i) < before]

    async def info(self, conversation_id: str) -> ConversationInfo:
        return (await self._info(conversation_id))[0]

    async def _info(self, conversation_id: str) -> tuple[ConversationInfo, bool]:
        """The conversation, and whether its thread may have branches (api/chat/branches.py)."""
        row = await self.store.conversation(conversation_id)
        claims = await self._claims()
        active = claims.get(conversation_id) if claims is not None else None
        if row is not None:
            active_row = await self.store.run(active) if active is not None else None
            return summary(row, active, active_row), row.forked
        if active is not None:
            try:
                described = await live.described_runs(self.redis, [active])
            except REDIS_DOWN:
                described = {}
            if active in described and visible(described[active].owner):
                return queued_only(described[active]), False
        raise NotFound(f"conversation {conversation_id} not found")

    async def detail(self, conversation_id: str) -> ConversationDetail:
        info, forked = await self._info(conversation_id)
        read = await self.store.read_thread(conversation_id, functools.partial(branches.current, forked))
        messages, forks = read if read is not None else ([], [])
        pending = None
        if info.status is RunStatus.WAITING:
            requests = await self.store.read_thread(conversation_id, pending_requests)
            if requests is not None:
                pending = [pending_call(r) for r in requests]
        calls = await self.store.tool_calls(conversation_id)
        ledger_view.annotate(messages, calls)
        branches.annotate(messages, forks, calls)
        return ConversationDetail(
            conversation=info, messages=messages, resumable=info.resumable, pending_approval=pending,
            resume_plan=ledger_view.resume_plan(messages, calls) if info.resumable else None,
        )

    async def markdown(self, conversation_id: str) -> str:
        info, forked = await self._info(conversation_id)
        calls = await self.store.tool_calls(conversation_id)
        read = await self.store.read_thread(conversation_id, functools.partial(branches.current, forked))
        if read is None:
            return transcript.markdown(info, [])
        messages, forks = read
        ledger_view.annotate(messages, calls)
        branches.annotate(messages, forks, calls)
        return transcript.markdown(info, messages)

    async def checkpoint_lines(self, conversation_id: str) -> list[CheckpointLine]:
        _, forked = await self._info(conversation_id)  # 404 for an unknown conversation
        read = functools.partial(branches.lines, forked)
        lines, forks = await self.store.read_thread(conversation_id, read) or ([], [])
        calls = await self.store.tool_calls(conversation_id)
        at = {fork.checkpoint: fork for fork in forks}
        for line in lines:  # each call as the ledger knows it now
            ledger_view.annotate(line.messages, calls)
            if (fork := at.get(line.checkpoint_id)) is not None:
                line.fork = branches.branch_of(fork, calls)
        return lines
