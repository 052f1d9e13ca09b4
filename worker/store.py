"""The worker's writes to the application tables (conversations, runs), on either engine.

(The ledger of tool calls writes its own table, worker/tools/ledger/records.py; its rows are deleted here
with their conversation.)

Written once against :class:`shared.storage.Database` (SQLite's writer connection, or a
PostgreSQL pool); on SQLite a connection separate from the checkpointer's: the saver shares
its connection's transaction, so mixing both on one connection would let one side commit the
other's half-done work.
"""

from __future__ import annotations

from collections.abc import Collection

from shared.contracts.jobs import JobKind, RunJob
from shared.contracts.runs import RunStatus
from shared.redis.liveness import new_worker_id
from shared.settings import Settings
from shared.storage import Database, is_database_unavailable
from shared.storage.engines import open_database
from shared.storage.leases import NOW, LeaseLost
from shared.storage.rows import RUN_COLUMNS, Breakdown, RunRow, title_of
from shared.storage.schema import iso_from_timestamp, now_iso
from shared.storage.sqlite import connect, end_failed_transaction
from shared.storage.threads.branch import branch_head

__all__ = ["RunRow", "RunStore", "connect", "end_failed_transaction", "is_database_unavailable"]


class RunStore:
    """The runs and conversations one worker records.

    On PostgreSQL the worker is one of many: ``owner`` names it, a run it starts is leased to
    it for ``lease_seconds`` (renewed by worker/run/lifetime/leases.py), and the outcome it records lands
    only while it still holds that lease (else :class:`LeaseLost`: another worker has taken
    the run over and recorded it). On SQLite ``owner`` is None: the writer lock is the owner.
    """

    def __init__(self, db: Database, *, owner: str | None = None, lease_seconds: float = 30.0) -> None:
        self.db = db
        self.owner = owner
        self.lease_seconds = lease_seconds

    @classmethod
    async def open(cls, settings: Settings) -> RunStore:
        """The database the settings name (shared/storage/engines.py); this worker leases its
        runs if the engine has many writers."""
        db = await open_database(settings, max_size=settings.worker_concurrency + 2)
        owner = new_worker_id() if db.leases else None
        return cls(db, owner=owner, lease_seconds=settings.run_lease_seconds)

    # --- leases (PostgreSQL) ------------------------------------------------------

    @property
    def _expires_sql(self) -> str:
        return f"{NOW} + ?" if self.owner is not None else "?"

    def _lease_params(self) -> tuple[str | None, float | None]:
        return (self.owner, self.lease_seconds) if self.owner is not None else (None, None)

    def _fence(self) -> tuple[str, tuple[str, ...]]:
        """The clause a write of this worker's own run carries: its lease is still this worker's."""
        return (" AND lease_owner = ?", (self.owner,)) if self.owner is not None else ("", ())

    async def renew(self, run_ids: Collection[str]) -> set[str]:
        """Extend the leases this worker still holds on ``run_ids``; the runs whose lease it holds now."""
        if self.owner is None or not run_ids:
            return set(run_ids) if self.owner is None else set()
        async with self.db.transaction() as tx:
            rows = await tx.fetchall(
                f"UPDATE runs SET lease_expires = {NOW} + ? WHERE id = ANY(?) AND lease_owner = ?"
                f" AND status = ? AND lease_expires > {NOW} RETURNING id",
                (self.lease_seconds, list(run_ids), self.owner, RunStatus.RUNNING),
            )
        return {str(r[0]) for r in rows}

    async def lapsed_runs(self) -> list[RunRow]:
        """Runs recorded ``running`` whose worker's lease lapsed (it died, or hangs)."""
        rows = await self.db.fetchall(
            f"SELECT {RUN_COLUMNS} FROM runs"
            f" WHERE status = ? AND (lease_expires IS NULL OR lease_expires < {NOW})",
            (RunStatus.RUNNING,),
        )
        return [RunRow.from_row(r) for r in rows]

    async def take_over(self, run_id: str) -> bool:
        """Lease a run whose lease lapsed to this worker, to record its outcome; False if it is not lapsed."""
        if self.owner is None:
            return True
        async with self.db.transaction() as tx:
            taken = await tx.execute(
                f"UPDATE runs SET lease_owner = ?, lease_expires = {NOW} + ? WHERE id = ? AND status = ?"
                f" AND (lease_expires IS NULL OR lease_expires < {NOW})",
                (self.owner, self.lease_seconds, run_id, RunStatus.RUNNING),
            )
        return taken == 1

    async def close(self) -> None:
        await self.db.close()

    async def get_run(self, run_id: str) -> RunRow | None:
        rows = await self.db.fetchall(f"SELECT {RUN_COLUMNS} FROM runs WHERE id = ?", (run_id,))
        return RunRow.from_row(rows[0]) if rows else None

    async def branch_head(self, conversation_id: str) -> str | None:
        """The head of the branch the conversation follows, when not its newest (None: the newest,
        or no conversation yet)."""
        return await branch_head(self.db.fetchall, conversation_id)

    async def running_runs(self) -> list[RunRow]:
        rows = await self.db.fetchall(
            f"SELECT {RUN_COLUMNS} FROM runs WHERE status = ?", (RunStatus.RUNNING,)
        )
        return [RunRow.from_row(r) for r in rows]

    async def start_run(self, job: RunJob) -> RunRow | None:
        """Record the run ``running`` (and its conversation, if new) in one transaction.

        Returns None, or the run's row if it was recorded before (arq delivered the
        job twice): then nothing is written. One transaction either way, so a first
        delivery (every run) pays for no separate look-up.
        """
        now = now_iso()
        try:
            async with self.db.transaction() as tx:
                # A switch names the branch the conversation follows from now on; any other
                # run writes the thread's latest checkpoints, which is what NULL follows. (A
                # crash before the run's input checkpoint then leaves the newest branch current.)
                head = job.checkpoint_id if job.kind is JobKind.SWITCH else None
                await tx.execute(
                    "INSERT INTO conversations"
                    " (id, title, created_at, updated_at, last_run_id, branch_head, forked, owner)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT(id) DO UPDATE SET updated_at = excluded.updated_at,"
                    " last_run_id = excluded.last_run_id, branch_head = excluded.branch_head,"
                    " forked = CASE WHEN excluded.forked = 1 THEN 1 ELSE conversations.forked END",
                    # created_at: when its first run was accepted, the key the API listed it
                    # by while it was queued; unchanged from then on (stable paging).
                    (job.conversation_id, title_of(job.message), iso_from_timestamp(job.enqueued_at), now,
                     job.run_id, head, int(job.checkpoint_id is not None), job.owner),
                )
                inserted = await tx.execute(
                    # The conversation's owner, whoever started it (an operator may).
                    "INSERT INTO runs (id, conversation_id, kind, status, enqueued_at, started_at,"
                    " owner, started_by, lease_owner, lease_expires)"
                    " SELECT ?, ?, ?, ?, ?, ?, owner, ?, ?,"
                    f" {self._expires_sql} FROM conversations WHERE id = ? ON CONFLICT(id) DO NOTHING",
                    (job.run_id, job.conversation_id, job.kind.value, RunStatus.RUNNING,
                     iso_from_timestamp(job.enqueued_at), now, job.started_by or job.owner,
                     *self._lease_params(), job.conversation_id),
                )
                if inserted == 0:
                    raise _AlreadyRecorded  # rolls back the conversation's update
        except _AlreadyRecorded:
            return await self.get_run(job.run_id)
        return None

    async def finish_run(
        self,
        run_id: str,
        conversation_id: str,
        *,
        status: RunStatus,
        error_code: str | None = None,
        error_message: str | None = None,
        message_count: int | None = None,
        pending_tasks: bool | None = None,
        step_count: int | None = None,
        breakdown: Breakdown | None = None,
        cancelled_by: str | None = None,
    ) -> None:
        """Record a run's outcome (and where its time went, and who cancelled it) and its
        conversation's new shape in one transaction."""
        now = now_iso()
        fence, fence_params = self._fence()
        async with self.db.transaction() as tx:
            updated = await tx.execute(
                "UPDATE runs SET status = ?, error_code = ?, error_message = ?, finished_at = ?,"
                f" step_count = COALESCE(?, step_count), breakdown = COALESCE(?, breakdown),"
                f" cancelled_by = COALESCE(?, cancelled_by), lease_expires = NULL WHERE id = ?{fence}",
                (status, error_code, error_message, now, step_count,
                 None if breakdown is None else breakdown.to_json(), cancelled_by, run_id, *fence_params),
            )
            if updated == 0 and self.owner is not None:
                raise LeaseLost(run_id)  # rolls back: the conversation is the new owner's to record
            await tx.execute(
                "UPDATE conversations SET updated_at = ?,"
                " message_count = COALESCE(?, message_count),"
                " pending_tasks = COALESCE(?, pending_tasks) WHERE id = ?",
                (now, message_count, None if pending_tasks is None else int(pending_tasks), conversation_id),
            )

    async def delete_conversation(self, conversation_id: str) -> list[str]:
        """Delete the conversation's row, its runs' and its tool calls' (worker/tools/ledger/)
        in one transaction; return those runs' ids."""
        async with self.db.transaction() as tx:
            rows = await tx.fetchall("SELECT id FROM runs WHERE conversation_id = ?", (conversation_id,))
            run_ids = [str(row[0]) for row in rows]
            await tx.execute("DELETE FROM tool_calls WHERE conversation_id = ?", (conversation_id,))
            # Its crons go with it: none fires on a thread that is gone (worker/schedule/crons/).
            await tx.execute("DELETE FROM crons WHERE thread_id = ?", (conversation_id,))
            await tx.execute("DELETE FROM runs WHERE conversation_id = ?", (conversation_id,))
            await tx.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))
        return run_ids


    async def rename_conversation(self, conversation_id: str, title: str) -> bool:
        """Give the conversation ``title``; False when it has no row (deleted meanwhile)."""
        async with self.db.transaction() as tx:
            changed = await tx.execute(
                "UPDATE conversations SET title = ? WHERE id = ?", (title, conversation_id)
            )
        return changed > 0

    async def copy_conversation(self, source_id: str, target_id: str, owner: str) -> bool:
        """Give ``target_id`` a row like ``source_id``'s, owned by ``owner``, with no runs (its
        thread's checkpoints copied before); False when the source has no row (deleted meanwhile).
        Safe twice: an existing row is left as it is."""
        now = now_iso()
        async with self.db.transaction() as tx:
            found = await tx.fetchall("SELECT 1 FROM conversations WHERE id = ?", (source_id,))
            await tx.execute(
                "INSERT INTO conversations (id, title, created_at, updated_at, message_count,"
                " pending_tasks, branch_head, forked, owner)"
                " SELECT ?, title, ?, ?, message_count, pending_tasks, branch_head, forked, ?"
                " FROM conversations WHERE id = ? ON CONFLICT(id) DO NOTHING",
                (target_id, now, now, owner, source_id),
            )
        return bool(found)


class _AlreadyRecorded(Exception):
    pass
