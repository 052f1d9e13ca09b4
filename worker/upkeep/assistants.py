"""Writing assistants: the ``assistant_write`` job the API enqueues (shared/contracts/assistants.py).

The API checked the request and who may touch the assistant before it enqueued the job; this
writes it in one transaction, then pushes the outcome to the list the API request waits on
(persist, then notify): ``done``, ``missing`` (the assistant or version is gone: deleted
meanwhile) or ``failed: ...``. Every op is safe twice (the job's docstring says how).
"""

from __future__ import annotations

import json
from typing import Any

import structlog
from redis.asyncio import Redis

from shared.contracts.assistants import AssistantWrite, assistant_done_key
from shared.redis.outcomes import STOPPED, failure, report
from shared.storage import Database, Tx
from shared.storage.schema import iso_from_timestamp
from worker.entry import entry_point

log = structlog.get_logger(__name__)

class _Missing(Exception):
    """The assistant (or the version) the job names is not stored."""


async def write(db: Database, redis: Redis, job: AssistantWrite) -> str:
    outcome = STOPPED
    try:
        async with db.transaction() as tx:
            await _OPS[job.op](tx, job)
        outcome = "done"
        log.info("assistant.written", op=job.op, assistant_id=job.assistant_id)
    except _Missing:
        outcome = "missing"
    except Exception as exc:
        outcome = failure(exc)
        log.exception("assistant.write_failed", op=job.op, assistant_id=job.assistant_id)
    finally:
        await report(redis, assistant_done_key(job.job_id), outcome, event="assistant.notify_failed")
    return outcome


def _json(value: Any) -> str:
    return json.dumps(value or {})


async def _create(tx: Tx, job: AssistantWrite) -> None:
    at = iso_from_timestamp(job.at)
    added = await tx.execute(
        "INSERT INTO assistants (id, owner, latest, created_at, updated_at) VALUES (?, ?, 1, ?, ?)"
        " ON CONFLICT(id) DO NOTHING",
        (job.assistant_id, job.owner, at, at),
    )
    if added:
        await _add_version(tx, job, 1, job.graph_id or "agent", job.name or "", job.description,
                           job.config, job.context, job.metadata, at)


async def _add_version(
    tx: Tx, job: AssistantWrite, version: int, graph_id: str, name: str, description: str | None,
    config: Any, context: Any, metadata: Any, at: str,
) -> None:
    await tx.execute(
        "INSERT INTO assistant_versions (id, version, graph_id, name, description, config, context,"
        " metadata, created_at, job_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (job.assistant_id, version, graph_id, name, description, _json(config), _json(context),
         _json(metadata), at, job.job_id),
    )


async def _update(tx: Tx, job: AssistantWrite) -> None:
    if await tx.fetchall("SELECT 1 FROM assistant_versions WHERE job_id = ?", (job.job_id,)):
        return  # a second delivery: its version is stored
    rows = await tx.fetchall(
        "SELECT v.graph_id, v.name, v.description, v.config, v.context, v.metadata,"
        " (SELECT MAX(version) FROM assistant_versions WHERE id = a.id)"
        " FROM assistants a JOIN assistant_versions v ON v.id = a.id AND v.version = a.latest"
        " WHERE a.id = ?",
        (job.assistant_id,),
    )
    if not rows:
        raise _Missing
    graph_id, name, description, config, context, metadata, newest = rows[0]
    version = int(newest) + 1
    at = iso_from_timestamp(job.at)
    await _add_version(
        tx, job, version, job.graph_id or graph_id, job.name if job.name is not None else name,
        job.description if job.description is not None else description,
        job.config if job.config is not None else json.loads(config),
        job.context if job.context is not None else json.loads(context),
        {**json.loads(metadata), **(job.metadata or {})}, at,
    )
    await tx.execute("UPDATE assistants SET latest = ?, updated_at = ? WHERE id = ?",
                     (version, at, job.assistant_id))


async def _latest(tx: Tx, job: AssistantWrite) -> None:
    changed = await tx.execute(
        "UPDATE assistants SET latest = ?, updated_at = ? WHERE id = ? AND EXISTS"
        " (SELECT 1 FROM assistant_versions WHERE id = ? AND version = ?)",
        (job.version, iso_from_timestamp(job.at), job.assistant_id, job.assistant_id, job.version),
    )
    if not changed:
        raise _Missing


async def _delete(tx: Tx, job: AssistantWrite) -> None:
    await tx.execute("DELETE FROM assistant_versions WHERE id = ?", (job.assistant_id,))
    await tx.execute("DELETE FROM assistants WHERE id = ?", (job.assistant_id,))


_OPS = {"create": _create, "update": _update, "latest": _latest, "delete": _delete}


@entry_point(AssistantWrite)
async def assistant_write_job(ctx: dict[str, Any], job: AssistantWrite) -> str:
    """arq's entry point: write."""
    return await write(ctx["store"].db, ctx["redis"], job)
