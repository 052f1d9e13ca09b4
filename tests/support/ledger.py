"""The ledger of tool effects (worker/tools/ledger/) on a real SQLite file, with no process: for the
fast tier's tests of it (tests/fast/test_ledger.py, tests/fast/test_uncertain.py)."""

from __future__ import annotations

import uuid
from pathlib import Path

from shared.storage.sqlite import SqliteDatabase
from worker.tools.ledger.calls import Ledger


async def ledger_on(directory: Path) -> tuple[Ledger, SqliteDatabase, str]:
    """A ledger on a new database in ``directory`` that holds one conversation: the ledger, the
    database (the caller closes it) and the conversation's id."""
    db = await SqliteDatabase.open(directory / "sophos.db")
    conversation = str(uuid.uuid4())
    async with db.transaction() as tx:
        await tx.execute(
            "INSERT INTO conversations (id, title, created_at, updated_at) VALUES (?, 't', 'x', 'x')",
            (conversation,),
        )
    return Ledger(db), db, conversation
