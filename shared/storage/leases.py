"""Runs' leases as every write sees them (PostgreSQL, ``runs.lease_owner`` / ``lease_expires``):
the lease of the run being executed, the error of a worker that lost it, and the check that
holds it until a transaction commits. Apart from shared/storage/postgres.py (the fenced
saver, which also checks it) so that importing these does not import psycopg: a worker on
SQLite never loads PostgreSQL's driver (~9 MB, bench figure 15).
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

from shared.storage import Tx

#: now, by the database's clock (every worker's lease is measured by the same clock)
NOW = "extract(epoch from clock_timestamp())"


@dataclass(frozen=True, slots=True)
class Lease:
    """A worker's claim on executing one run: every write of the run checks it."""

    run_id: str
    owner: str


#: the lease of the run whose code is executing (set by the worker around a run's graph)
CURRENT_LEASE: ContextVar[Lease | None] = ContextVar("sophos_lease", default=None)


class LeaseLost(Exception):
    """The worker no longer holds the run's lease: another worker has taken the run over."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"the lease on run {run_id} has lapsed; another worker recorded it interrupted")
        self.run_id = run_id


async def hold_lease(tx: Tx) -> None:
    """In ``tx``: the running run's lease (:data:`CURRENT_LEASE`) is still this worker's, held
    (``FOR SHARE``) until ``tx`` commits; else :class:`LeaseLost`. No lease set (SQLite, or no
    run): nothing to check.

    The ledger's intent commit (worker/tools/ledger/records.py) runs it, so a worker that lost its run sends
    no tool call.
    """
    lease = CURRENT_LEASE.get()
    if lease is None:
        return
    rows = await tx.fetchall(
        "SELECT 1 FROM runs WHERE id = ? AND lease_owner = ? AND status = 'running'"
        f" AND lease_expires > {NOW} FOR SHARE",
        (lease.run_id, lease.owner),
    )
    if not rows:
        raise LeaseLost(lease.run_id)
