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

from api import live, transcript
from api.runs import REDIS_DOWN, run_error
from api.schemas import CheckpointLine, ConversationDetail, ConversationInfo, ConversationSummary
from api.store import ConversationRow, RunRow, Store
from api.timefmt import iso_from_timestamp
from shared.contracts import RunStatus
from shared.errors import NotFound

log = structlog.get_logger(__name__)


def _status(row: ConversationRow, active: str | None, active_row: RunRow | None) -> RunStatus:
    if active is not None:
        # Claimed: queued until the worker records the run (then the row's status).
        return RunStatus(active_row.status) if active_row is not None else RunStatus.QUEUED
    try:
        return RunStatus(row.last_status or RunStatus.COMPLETED)
    except ValueError:
        return RunStatus.COMPLETED


def summary(row: ConversationRow, active: str | None, active_row: RunRow | None) -> ConversationInfo:
    """The conversation's fields; ``active`` is the run holding it (queued or running), if any."""
    status = _status(row, active, active_row)
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
        # Decided by the checkpoint (pending tasks), never by the last run's status.
        resumable=row.pending_tasks and active is None and status is not RunStatus.RUNNING,
    )


def queued_only(run: live.QueuedRun) -> ConversationInfo:
    """A conversation whose first run is still queued: described by that run."""
    at = iso_from_timestamp(run.enqueued_at)
    return ConversationInfo(
        id=run.conversation_id, title=run.title, created_at=at, updated_at=at,
        message_count=0, status=RunStatus.QUEUED, resumable=False,
    )


def _as_summary(info: ConversationInfo) -> ConversationSummary:
    return ConversationSummary(
        id=info.id, title=info.title, created_at=info.created_at, updated_at=info.updated_at,
        message_count=info.message_count, status=info.status, error=info.error,
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

    async def newest_first(self) -> list[ConversationSummary]:
        rows = await self.store.conversations()
        claims = await self._claims() or {}
        active_rows = await self.store.runs_by_id(list(claims.values()))
        infos = [summary(r, claims.get(r.id), active_rows.get(claims.get(r.id, ""))) for r in rows]
        known = {r.id for r in rows}
        unrecorded = [run for conv, run in claims.items() if conv not in known]
        if unrecorded:
            try:
                described = await live.described_runs(self.redis, unrecorded)
            except REDIS_DOWN:
                described = {}
            infos += [queued_only(run) for run in described.values()]
        infos.sort(key=lambda c: (c.updated_at, c.id), reverse=True)
        return [_as_summary(i) for i in infos]

    async def info(self, conversation_id: str) -> ConversationInfo:
        row = await self.store.conversation(conversation_id)
        claims = await self._claims()
        active = claims.get(conversation_id) if claims is not None else None
        if row is not None:
            active_row = await self.store.run(active) if active is not None else None
            return summary(row, active, active_row)
        if active is not None:
            try:
                described = await live.described_runs(self.redis, [active])
            except REDIS_DOWN:
                described = {}
            if active in described:
                return queued_only(described[active])
        raise NotFound(f"conversation {conversation_id} not found")

    async def detail(self, conversation_id: str) -> ConversationDetail:
        info = await self.info(conversation_id)
        messages = await self.store.read_thread(conversation_id, transcript.current_messages)
        return ConversationDetail(conversation=info, messages=messages or [], resumable=info.resumable)

    async def markdown(self, conversation_id: str) -> str:
        info = await self.info(conversation_id)
        render = functools.partial(transcript.current_markdown, info)
        text = await self.store.read_thread(conversation_id, render)
        return text if text is not None else transcript.markdown(info, [])

    async def checkpoint_lines(self, conversation_id: str) -> list[CheckpointLine]:
        await self.info(conversation_id)  # 404 for an unknown conversation
        return await self.store.read_thread(conversation_id, transcript.checkpoint_lines) or []
