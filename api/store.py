"""The API's reads: the application tables and the threads, on whichever engine the settings
name (shared/storage/engines.py opens it; shared/storage/reading.py reads it, read-only).

The worker is the only writer. Until a worker has created and migrated the database there is
nothing to read: every call returns nothing and looks again next time.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import structlog

from api.auth.scope import owned
from api.conversations import title_search
from api.conversations.ledger_view import LEDGER_COLUMNS, LedgerRow
from api.http.readers import Readers
from api.thread_read import hang, read_thread
from shared.contracts.assistants import ASSISTANT_COLUMNS, AssistantRow
from shared.contracts.crons import CRON_COLUMNS, CronRow
from shared.contracts.runs import RunStatus
from shared.errors import DatabaseUnavailable
from shared.settings import Settings
from shared.storage.engines import open_reader
from shared.storage.reading import Reader
from shared.storage.rows import RUN_COLUMNS, RunRow
from shared.storage.schema import MIGRATIONS
from shared.storage.threads.branch import thread_config

# LangGraph is loaded by the reader processes, which run the reads (api/thread_read.py), not
# by the API's main process, which only names them: ≈0.6 s of CPU and ≈45 MB less per API
# process (tests/test_api_readers.py checks the process).
if TYPE_CHECKING:
    from api.thread_read import ThreadRead

log = structlog.get_logger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ConversationRow:
    id: str
    title: str
    created_at: str
    updated_at: str
    message_count: int
    pending_tasks: bool
    last_run_id: str | None
    last_status: str | None
    last_error_code: str | None
    last_error_message: str | None
    #: the head of the branch the conversation follows, when not the thread's latest checkpoint
    branch_head: str | None = None
    #: a run of it started from a checkpoint of its choosing: its thread may have branches
    forked: bool = False
    #: whose it is
    owner: str = "local"


_CONVERSATION_SQL = """
SELECT c.id, c.title, c.created_at, c.updated_at, c.message_count, c.pending_tasks, c.last_run_id,
       r.status, r.error_code, r.error_message, c.branch_head, c.forked, c.owner
FROM conversations c LEFT JOIN runs r ON r.id = c.last_run_id
"""
_RUN_SQL = f"SELECT {RUN_COLUMNS} FROM runs"

#: the order of the runs listing (with ``id``): when a run was accepted
_RUN_KEY = "COALESCE(enqueued_at, started_at)"

# The conversations listing, newest first by (created_at, id): a key that never
# changes, so paging is stable while conversations are updated (shared/storage/schema.py:
# the index ``conversations_listing`` serves it, a page costs the same at any size).
# A user's page is read through ``conversations_by_owner`` (owner, created_at, id) the same way.


def conversation_page_sql(conditions: Sequence[str]) -> str:
    """A page of conversations meeting every one of ``conditions`` (the caller's own first)."""
    return f"{_CONVERSATION_SQL} WHERE {' AND '.join(conditions)} ORDER BY c.created_at DESC, c.id DESC"
#: what /metrics shows of the runs table (index ``runs_by_status``)
RUNNING_COUNT_SQL = "SELECT count(*) FROM runs WHERE status = ?"
#: conversations whose last run ended waiting for a decision: the waiting runs through the status
#: index, each checked against its conversation's last run by primary key. A subquery per waiting
#: run, not a join: with statistics older than a big store's growth, PostgreSQL's planner hashed
#: every conversation for it (a /metrics scrape 4.3x slower at 100,000 conversations, figure 24)
WAITING_COUNT_SQL = (
    "SELECT count(*) FROM runs r WHERE r.status = ?"
    " AND r.id = (SELECT c.last_run_id FROM conversations c WHERE c.id = r.conversation_id)"
)


def _conversation(row: Sequence[Any]) -> ConversationRow:
    return ConversationRow(
        id=row[0], title=row[1], created_at=row[2], updated_at=row[3], message_count=int(row[4] or 0),
        pending_tasks=bool(row[5]), last_run_id=row[6], last_status=row[7], last_error_code=row[8],
        last_error_message=row[9], branch_head=row[10], forked=bool(row[11]), owner=row[12],
    )



class Store:
    """The API's read-only view of the database, opened on first use."""

    def __init__(self, db: Reader, readers: Readers, *, hang_read: str | None = None) -> None:
        self.db = db
        self._schema_ready = False
        self._checkpoints_ready = False
        self.readers = readers
        #: test-only (SOPHOS_FAULT_HANG_READ): reads of this conversation never end
        self._hang_read = hang_read

    def open(self) -> None:
        """Start one reader process in the background, ahead of the first read.

        Started on the first read instead, a reader made that read wait for the
        process to import LangGraph: about a second on a quiet machine (measured:
        1.6 to 2.7 s for the first detail or decision under load, 0.01 to 0.03 s after).
        """
        self.readers.warm()

    async def close(self) -> None:
        await self.db.close()
        await self.readers.aclose()

    async def schema_version(self) -> int | None:
        """How many migrations the database has had; None while it does not exist."""
        return await self.db.schema_version()

    async def _fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Rows of ``sql`` once the worker has created the application tables ([] before)."""
        if not self._schema_ready:
            version = await self.db.schema_version()
            if version is None or version < len(MIGRATIONS):
                return []
            self._schema_ready = True
        return await self.db.fetchall(sql, params)

    # --- application tables -----------------------------------------------------

    # Every read of a user's rows is the caller's own (api/auth/scope.py): another user's
    # conversation, run or cron is as absent here as one that does not exist.

    async def conversation(self, conversation_id: str) -> ConversationRow | None:
        mine, who = owned("c.owner")
        rows = await self._fetch(f"{_CONVERSATION_SQL} WHERE c.id = ? AND {mine}", (conversation_id, *who))
        return _conversation(rows[0]) if rows else None

    async def conversations(
        self, *, limit: int, before: tuple[str, str] | None = None, query: str | None = None
    ) -> list[ConversationRow]:
        """Conversations newest first by (created_at, id); ``before``: only those older than that key;
        ``query``: only those whose title contains it, case aside (api/conversations/title_search.py)."""
        mine, who = owned("c.owner")
        where = [mine]
        params: list[Any] = [*who]
        if query:
            dialect = self.db.threads.dialect
            where.append(title_search.condition(dialect))
            params.append(title_search.pattern(query, dialect))
        if before is not None:
            where.append("(c.created_at, c.id) < (?, ?)")
            params += before
        rows = await self._fetch(f"{conversation_page_sql(where)} LIMIT ?", (*params, limit))
        return [_conversation(r) for r in rows]

    async def existing_conversations(self, conversation_ids: Sequence[str]) -> set[str]:
        """Which of these conversations have a row."""
        found: set[str] = set()
        ids = list(dict.fromkeys(conversation_ids))
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            mine, who = owned()
            rows = await self._fetch(
                f"SELECT id FROM conversations WHERE id IN ({marks}) AND {mine}", (*chunk, *who)
            )
            found.update(str(r[0]) for r in rows)
        return found

    async def run(self, run_id: str) -> RunRow | None:
        mine, who = owned()
        rows = await self._fetch(f"{_RUN_SQL} WHERE id = ? AND {mine}", (run_id, *who))
        return RunRow.from_row(rows[0]) if rows else None

    async def runs_by_id(self, run_ids: Sequence[str]) -> dict[str, RunRow]:
        found: dict[str, RunRow] = {}
        ids = list(dict.fromkeys(run_ids))
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            mine, who = owned()
            for row in await self._fetch(f"{_RUN_SQL} WHERE id IN ({marks}) AND {mine}", (*chunk, *who)):
                found[row[0]] = RunRow.from_row(row)
        return found

    async def runs(
        self,
        *,
        status: str | None,
        conversation_id: str | None,
        limit: int,
        before: tuple[str, str] | None = None,
    ) -> list[RunRow]:
        """Runs newest first by (enqueued_at, id); ``before``: only those older than that key."""
        mine, who = owned()
        where: list[str] = [mine]
        params: list[Any] = [*who]
        if status is not None:
            where.append("status = ?")
            params.append(status)
        if conversation_id is not None:
            where.append("conversation_id = ?")
            params.append(conversation_id)
        if before is not None:
            where.append(f"({_RUN_KEY} < ? OR ({_RUN_KEY} = ? AND id < ?))")
            params += [before[0], before[0], before[1]]
        clause = f"WHERE {' AND '.join(where)}"
        rows = await self._fetch(
            f"{_RUN_SQL} {clause} ORDER BY {_RUN_KEY} DESC, id DESC LIMIT ?",
            [*params, limit],
        )
        return [RunRow.from_row(r) for r in rows]

    async def tool_calls(self, conversation_id: str) -> list[LedgerRow]:
        """The conversation's rows of the ledger of tool effects, oldest intent first."""
        if await self.conversation(conversation_id) is None:
            return []
        rows = await self._fetch(
            f"SELECT {LEDGER_COLUMNS} FROM tool_calls WHERE conversation_id = ? ORDER BY intent_at",
            (conversation_id,),
        )
        return [LedgerRow.from_row(r) for r in rows]

    async def crons(
        self, *, cron_id: str | None = None, thread_id: str | None = None, enabled: bool | None = None,
        order: str = "created_at DESC", limit: int = 1, offset: int = 0,
    ) -> list[CronRow]:
        """Crons (shared/contracts/crons.py), filtered by id, thread or ``enabled``; ``order``: a
        column and direction."""
        mine, who = owned()
        given = (("id = ?", cron_id), ("thread_id = ?", thread_id),
                 ("enabled = ?", None if enabled is None else int(enabled)))
        where = [c for c, v in given if v is not None]
        rows = await self._fetch(
            f"SELECT {CRON_COLUMNS} FROM crons WHERE {' AND '.join([*where, mine])}"
            f" ORDER BY {order}, id LIMIT ? OFFSET ?",
            (*(v for _, v in given if v is not None), *who, limit, offset),
        )
        return [CronRow.from_row(tuple(r)) for r in rows]

    async def assistants(
        self, *, assistant_id: str | None = None, versions: bool = False, limit: int = 1000,
    ) -> list[AssistantRow]:
        """The caller's stored assistants (shared/contracts/assistants.py) at their latest
        version, newest first; or, with ``versions``, every version of ``assistant_id``, newest
        first."""
        mine, who = owned("a.owner")
        joined = "v.version = a.latest" if not versions else "1 = 1"
        where = ["a.id = ?"] if assistant_id is not None else []
        rows = await self._fetch(
            f"SELECT {ASSISTANT_COLUMNS} FROM assistants a JOIN assistant_versions v ON v.id = a.id"
            f" AND {joined} WHERE {' AND '.join([*where, mine])}"
            " ORDER BY a.created_at DESC, a.id, v.version DESC LIMIT ?",
            (*([assistant_id] if assistant_id is not None else []), *who, limit),
        )
        return [AssistantRow.from_row(tuple(r)) for r in rows]

    async def running_count(self) -> int:
        """How many runs are recorded ``running`` (a search of the status index, not a scan)."""
        rows = await self._fetch(RUNNING_COUNT_SQL, (RunStatus.RUNNING.value,))
        return int(rows[0][0]) if rows else 0

    async def running_ids(self) -> list[str]:
        """The runs recorded ``running``, whoever owns them (a few per worker, through the status
        index): never shown, only counted out of the queue's positions (api/runs/queue.py)."""
        rows = await self._fetch("SELECT id FROM runs WHERE status = ?", (RunStatus.RUNNING.value,))
        return [str(r[0]) for r in rows]

    async def recorded_ids(self, run_ids: list[str]) -> set[str]:
        """Which of ``run_ids`` have a row, whoever owns them (only counted, never shown: a /metrics
        scrape leaves started runs out of the queue's figures)."""
        found: set[str] = set()
        for start in range(0, len(run_ids), 500):
            chunk = run_ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            rows = await self._fetch(f"SELECT id FROM runs WHERE id IN ({marks})", chunk)
            found.update(str(r[0]) for r in rows)
        return found

    async def waiting_count(self) -> int:
        """How many conversations wait for a decision on a tool call (their last run ended ``waiting``)."""
        rows = await self._fetch(WAITING_COUNT_SQL, (RunStatus.WAITING.value,))
        return int(rows[0][0]) if rows else 0

    # --- checkpoints ------------------------------------------------------------

    async def read_thread(self, conversation_id: str, read: ThreadRead[T]) -> T | None:
        """``read(graph, config)`` on the conversation's thread, in a reader process.

        None while the checkpoint tables do not exist. The thread's state is read
        through LangGraph's state API (``get_state`` / ``get_state_history`` of a
        graph of the agent's shape), the only way to get its messages: a checkpoint
        stores what its step added, not the whole list. Rebuilding and decoding
        them is pure-Python CPU work that grows with the conversation: on the event
        loop it would hold up every stream of this process, and in a thread too, as
        it holds the interpreter lock (measured: a 400-message export made other
        streams' events late by 27 ms at the median, 470 ms at p95). So it runs in a
        process of its own, on a connection of its own; ``read`` must be
        picklable (a module-level function, or a partial of one). A read that
        outlasts READ_TIMEOUT, or whose request is cancelled, stops its reader
        (api/http/readers.py): 503 READ_TIMEOUT.
        """
        if not self._checkpoints_ready:
            if not await self.db.has_checkpoints():
                return None
            self._checkpoints_ready = True
        if conversation_id == self._hang_read:
            read = functools.partial(hang, read)
        # The branch the conversation follows (api/chat/branches.py): a read sees that branch.
        config = await thread_config(self._fetch, conversation_id)
        try:
            return await self.readers.run(
                read_thread, self.db.threads, conversation_id, read, config,
                what=f"conversation {conversation_id}",
            )
        except DatabaseUnavailable as exc:
            log.warning("database.read_failed", error=exc.message)
            raise


#: most processes reading threads for one API process: as many exports at once
READER_PROCESSES = 2
#: what a reader imports before its first read: the functions reads send it, and LangGraph and
#: langchain, which those import only when they run (so that the API's main process never does).
#: Never this module, nor any that imports Redis, arq or the web framework: a reader would hold
#: them for nothing (tests/test_api_readers.py, tests/fast/test_snapshot.py).
READER_MODULES = (
    "api.thread_read", "api.conversations.transcript", "api.chat.approvals", "api.chat.branches",
    "api.protocol.threads.state", "api.protocol.runs.fork_reads",
    "shared.storage.threads.snapshot", "shared.storage.threads.decoding", "shared.storage.threads.history",
    "langgraph.checkpoint.sqlite",
)


def open_store(settings: Settings) -> Store:
    """The API's store on the database the settings name (call ``open`` next)."""
    readers = Readers(
        size=READER_PROCESSES, timeout=settings.read_timeout, preload=READER_MODULES,
        idle_seconds=settings.reader_idle_seconds,
    )
    return Store(open_reader(settings), readers, hang_read=settings.fault_hang_read)
