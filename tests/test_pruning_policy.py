"""``CHECKPOINT_PRUNE=latest``: the upkeep's batches (worker/upkeep/pruning.py ``Pruning.once``).

The worker's own code on a real SQLite file filled by bench/bigstore.py (long threads: a full copy
of the messages at the 100th update) and the session's Redis, without the worker process: the
module's pass is what the worker's sweep calls every few seconds (worker/resources.py).
tests/test_pruning.py prunes through the worker's job.
"""

from __future__ import annotations

from pathlib import Path

from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from redis.asyncio import Redis

from bench import bigstore
from shared.redis.keys import ACTIVE_RUNS
from shared.storage.engines import open_database
from shared.storage.schema import iso_from_timestamp
from worker.upkeep.pruning import Pruning


async def test_each_conversation_is_pruned_once_after_each_change_and_never_while_held(
    tmp_path: Path, redis: Redis
) -> None:
    settings = bigstore.settings_for("sqlite", str(tmp_path / "sophos.db"))
    steps = bigstore.template(60)
    await bigstore.fill(settings, 3, steps=steps)
    db = await open_database(settings, max_size=1)
    try:
        ids = [str(r[0]) for r in await db.fetchall("SELECT id FROM conversations ORDER BY updated_at, id")]

        async def checkpoints(conversation: str) -> int:
            rows = await db.fetchall("SELECT count(*) FROM checkpoints WHERE thread_id = ?", (conversation,))
            return int(rows[0][0])

        async with AsyncSqliteSaver.from_conn_string(str(settings.database_path)) as saver:
            pruning = Pruning(db, saver, redis)
            await redis.hset(ACTIVE_RUNS, ids[1], "a-run-of-it")  # a run of it is queued or running
            assert await pruning.once() == 2
            counts = [await checkpoints(c) for c in ids]
            assert counts[1] == len(steps) and counts[0] == counts[2] < len(steps)
            assert await pruning.once() == 0  # nothing changed since
            assert await checkpoints(ids[1]) == len(steps)

            # Its run ends: the conversation's updated_at moves on, and the next pass meets it.
            await redis.hdel(ACTIVE_RUNS, ids[1])
            async with db.transaction() as tx:
                await tx.execute(
                    "UPDATE conversations SET updated_at = ? WHERE id = ?",
                    (iso_from_timestamp(4102444800.0), ids[1]),
                )
            assert await pruning.once() == 1
            assert await checkpoints(ids[1]) == counts[0]
    finally:
        await db.close()
