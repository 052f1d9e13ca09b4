"""Copying a thread (the Agent Protocol's ``POST /threads/{id}/copy``): its checkpoints, then its
conversation's row, then tell the API waiting on it (persist, then notify).

The API checked the source is the caller's and that no run holds it, and wrote the copy's
thread record (api/protocol/threads/records.py). Every checkpoint goes through the saver's ``aput``,
oldest first, under the new thread id and with the same checkpoint ids (so a branch head the
row names is the copy's too), each with the channels that changed since its parent, and its
pending writes through ``aput_writes``: the messages are a DeltaChannel
(shared/storage/threads/state.py), rebuilt from the writes back to the last snapshot, so the whole
chain is copied, as ``BaseCheckpointSaver.copy_thread`` asks (no saver here implements it).
The row goes last: until it exists the copy reads as an empty thread, never a partial one;
a copy that fails, or whose source was deleted meanwhile, deletes what it wrote.
Writing the same checkpoints and row again is harmless, so a second delivery does what the
first did.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import structlog
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, ChannelVersions
from redis.asyncio import Redis

from shared.contracts.jobs import CopyJob
from shared.redis.keys import copied_key
from shared.redis.outcomes import STOPPED, failure, report
from worker.entry import entry_point
from worker.store import RunStore

log = structlog.get_logger(__name__)

async def copy_checkpoints(saver: BaseCheckpointSaver[Any], source_id: str, target_id: str) -> int:
    """Every checkpoint of ``source_id`` and its writes, under ``target_id``; how many checkpoints."""
    source: RunnableConfig = {"configurable": {"thread_id": source_id}}
    tuples = [t async for t in saver.alist(source)]
    versions: dict[str, ChannelVersions] = {}
    for item in reversed(tuples):  # alist is newest first
        configurable = item.config["configurable"]
        ns, checkpoint_id = configurable.get("checkpoint_ns", ""), configurable["checkpoint_id"]
        parent_id = (item.parent_config or {}).get("configurable", {}).get("checkpoint_id")
        channel_versions = item.checkpoint["channel_versions"]
        parent = versions.get(parent_id) if parent_id else None
        # What the graph's loop passes: the channels whose version changed since the parent.
        new_versions = (
            {k: v for k, v in channel_versions.items() if parent.get(k) != v}
            if parent is not None else dict(channel_versions)
        )
        target: dict[str, Any] = {"thread_id": target_id, "checkpoint_ns": ns}
        if parent_id:
            target["checkpoint_id"] = parent_id  # the saver records it as the parent
        await saver.aput({"configurable": target}, item.checkpoint, item.metadata, new_versions)
        versions[checkpoint_id] = channel_versions
        by_task: dict[str, list[tuple[str, Any]]] = defaultdict(list)
        for task_id, channel, value in item.pending_writes or ():
            by_task[task_id].append((channel, value))
        at: RunnableConfig = {
            "configurable": {"thread_id": target_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}
        }
        for task_id, writes in by_task.items():
            await saver.aput_writes(at, writes, task_id)
    return len(tuples)


async def copy(saver: BaseCheckpointSaver[Any], store: RunStore, redis: Redis, job: CopyJob) -> str:
    outcome = STOPPED
    try:
        checkpoints = await copy_checkpoints(saver, job.source_id, job.target_id)
        found = await store.copy_conversation(job.source_id, job.target_id, job.owner)
        outcome = "copied" if found else "gone"
        log.info("thread.copied" if found else "thread.copy_gone", checkpoints=checkpoints,
                 conversation_id=job.source_id, copy_id=job.target_id)
        if not found:  # deleted meanwhile: what was copied of it goes too
            await saver.adelete_thread(job.target_id)
    except Exception as exc:
        outcome = failure(exc)
        log.exception("thread.copy_failed", conversation_id=job.source_id)
        await _forget(saver, job.target_id)
    finally:
        await report(redis, copied_key(job.job_id), outcome, event="thread.copy_notify_failed")
    return outcome


async def _forget(saver: BaseCheckpointSaver[Any], target_id: str) -> None:
    """Delete what a failed copy wrote of the copy's checkpoints (the API drops its record)."""
    try:
        await saver.adelete_thread(target_id)
    except Exception as exc:
        log.warning("thread.copy_cleanup_failed", copy_id=target_id, error=str(exc))


@entry_point(CopyJob)
async def copy_job(ctx: dict[str, Any], job: CopyJob) -> str:
    """arq's entry point."""
    return await copy(ctx["saver"], ctx["store"], ctx["redis"], job)
