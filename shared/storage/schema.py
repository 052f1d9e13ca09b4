"""Application tables beside LangGraph's checkpoint tables, on SQLite or PostgreSQL.

Migrations are numbered, in SQL both engines run; how many have been applied is
``PRAGMA user_version`` on SQLite, the ``sophos_schema`` table on PostgreSQL
(shared/storage). Only workers apply them; the API reads.
"""

from __future__ import annotations

from datetime import UTC, datetime

MIGRATIONS: tuple[str, ...] = (
    # 1: conversations and runs
    """
    CREATE TABLE conversations (
        id            TEXT PRIMARY KEY,
        title         TEXT NOT NULL,
        created_at    TEXT NOT NULL,
        updated_at    TEXT NOT NULL,
        message_count INTEGER NOT NULL DEFAULT 0,
        -- 1 when the thread's last checkpoint has tasks still to run; written by
        -- the worker, which holds the graph, each time a run of it ends.
        pending_tasks INTEGER NOT NULL DEFAULT 0,
        last_run_id   TEXT
    );
    CREATE TABLE runs (
        id              TEXT PRIMARY KEY,
        conversation_id TEXT NOT NULL REFERENCES conversations(id),
        kind            TEXT NOT NULL,
        status          TEXT NOT NULL,
        error_code      TEXT,
        error_message   TEXT,
        enqueued_at     TEXT,
        started_at      TEXT NOT NULL,
        finished_at     TEXT,
        step_count      INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX runs_conversation ON runs(conversation_id, started_at);
    CREATE INDEX runs_status ON runs(status);
    CREATE INDEX conversations_updated ON conversations(updated_at);
    """,
    # 2: the order GET /api/runs pages in (newest accepted first); measured with 20,000
    # runs: a page of 50 in 14 ms instead of 93 ms
    """
    CREATE INDEX runs_listing ON runs(COALESCE(enqueued_at, started_at), id);
    """,
    # 3: the conversations listing in pages, newest created first (api/store.py), and the
    # runs listing filtered by status or by conversation, each read in the index's order
    # instead of sorting every matching row (tests/test_paging.py: EXPLAIN QUERY PLAN).
    # runs_by_status also answers /metrics' count of running runs; it replaces runs_status.
    """
    CREATE INDEX conversations_listing ON conversations(created_at, id);
    CREATE INDEX runs_by_status ON runs(status, COALESCE(enqueued_at, started_at), id);
    CREATE INDEX runs_by_conversation ON runs(conversation_id, COALESCE(enqueued_at, started_at), id);
    DROP INDEX runs_status;
    """,
    # 4: who executes a run, until when (PostgreSQL: a worker's lease, renewed while it runs,
    # checked in the transaction of every write of the run; on SQLite the writer lock is the
    # owner and these stay NULL), and never two running runs of one conversation.
    """
    ALTER TABLE runs ADD COLUMN lease_owner TEXT;
    ALTER TABLE runs ADD COLUMN lease_expires DOUBLE PRECISION;
    CREATE UNIQUE INDEX runs_one_running ON runs(conversation_id) WHERE status = 'running';
    """,
    # 5: the ledger of tool calls (worker/tools/ledger/): one row per call of an assistant message,
    # its intent committed before the request leaves for the MCP server, its outcome committed
    # before the call's task returns. ``state`` is 'intent' (sent, or about to be; no outcome
    # known) or 'done' (``status`` and ``result`` are the outcome). ``attempt`` counts the
    # intents committed; ``idempotency_key`` is the same on every attempt of the call.
    """
    CREATE TABLE tool_calls (
        conversation_id TEXT NOT NULL REFERENCES conversations(id),
        message_id      TEXT NOT NULL,
        tool_call_id    TEXT NOT NULL,
        run_id          TEXT NOT NULL,
        tool            TEXT NOT NULL,
        arguments       TEXT NOT NULL,
        idempotency_key TEXT NOT NULL UNIQUE,
        attempt         INTEGER NOT NULL,
        state           TEXT NOT NULL,
        status          TEXT,
        result          TEXT,
        intent_at       TEXT NOT NULL,
        outcome_at      TEXT,
        PRIMARY KEY (conversation_id, message_id, tool_call_id)
    );
    """,
    # 6: whether the call's tool was safe to repeat when the call was made (its MCP annotations,
    # or ``safeToRepeat`` in mcp.json): what a resume does with the call if it has no outcome
    # (sends it again, or asks), shown to the user before they resume. NULL: recorded before.
    """
    ALTER TABLE tool_calls ADD COLUMN safe_to_repeat INTEGER;
    """,
    # 7: where a run spent its time (shared/storage/rows.py ``Breakdown``, JSON), recorded with its outcome
    """
    ALTER TABLE runs ADD COLUMN breakdown TEXT;
    """,
    # 8: the branch a conversation follows when it is not the thread's newest (an edit or a
    # regenerate forked the thread, then the user switched back): the head checkpoint of that
    # branch. NULL: the thread's latest checkpoint, as always. Set by a ``switch`` run, cleared
    # by the next run, whose checkpoints are the thread's latest (worker/store.py start_run).
    # ``forked``: 1 once a run started from a checkpoint of its own choosing (an edit, a
    # regenerate, a switch): only then can the thread have branches, and only then do the API's
    # reads walk its tree of checkpoints (api/chat/branches.py).
    """
    ALTER TABLE conversations ADD COLUMN branch_head TEXT;
    ALTER TABLE conversations ADD COLUMN forked INTEGER NOT NULL DEFAULT 0;
    """,
    # 9: crons (the Agent Protocol's ``client.crons``; shared/contracts/crons.py, worker/schedule/crons/):
    # a run on a schedule. ``thread_id`` NULL: a new thread per tick. ``next_tick`` (seconds since the
    # epoch) is the tick to fire next: the worker that moves it on (a conditional update) is the
    # one that fires it. ``fired``, ``skipped`` and ``last_*`` say what the ticks did.
    """
    CREATE TABLE crons (
        id           TEXT PRIMARY KEY,
        thread_id    TEXT,
        schedule     TEXT NOT NULL,
        message      TEXT NOT NULL,
        metadata     TEXT NOT NULL,
        created_at   TEXT NOT NULL,
        updated_at   TEXT NOT NULL,
        next_tick    BIGINT NOT NULL,
        fired        INTEGER NOT NULL DEFAULT 0,
        skipped      INTEGER NOT NULL DEFAULT 0,
        last_tick    BIGINT,
        last_outcome TEXT,
        last_run_id  TEXT
    );
    CREATE INDEX crons_due ON crons(next_tick);
    CREATE INDEX crons_by_thread ON crons(thread_id);
    """,
    # 10: identities (api/auth/, shared/users.py, DESIGN.md "People and what they may
    # touch"). ``users``: a key's SHA-256 digest only, never the key; a revoked user keeps their
    # row (their name still owns what they made, and is not given to someone else). ``owner``:
    # who a conversation, a run and a cron belong to; a run's ``owner`` is its conversation's
    # (so a user's runs page without a join), ``started_by`` and ``cancelled_by`` who did that
    # (an operator may act on a user's conversation). What was stored before belongs to
    # 'local', the user of an API without identities (AUTH_ADOPT_OWNER names another: the
    # worker hands it over at start-up, shared/users.py ``adopt``).
    """
    CREATE TABLE users (
        name       TEXT PRIMARY KEY,
        key_digest TEXT NOT NULL UNIQUE,
        operator   INTEGER NOT NULL DEFAULT 0,
        created_at TEXT NOT NULL,
        revoked_at TEXT
    );
    ALTER TABLE conversations ADD COLUMN owner TEXT NOT NULL DEFAULT 'local';
    ALTER TABLE runs ADD COLUMN owner TEXT NOT NULL DEFAULT 'local';
    ALTER TABLE runs ADD COLUMN started_by TEXT;
    ALTER TABLE runs ADD COLUMN cancelled_by TEXT;
    ALTER TABLE crons ADD COLUMN owner TEXT NOT NULL DEFAULT 'local';
    CREATE INDEX conversations_by_owner ON conversations(owner, created_at, id);
    CREATE INDEX runs_by_owner ON runs(owner, COALESCE(enqueued_at, started_at), id);
    CREATE INDEX crons_by_owner ON crons(owner, created_at, id);
    """,
    # 11: assistants (the Agent Protocol's ``client.assistants``: configurations of the one agent,
    # shared/contracts/assistants.py). ``assistants``: one row per assistant, its owner and the
    # version its runs use (``latest``); ``assistant_versions``: every version, never changed
    # once written (an update adds one). ``job_id``: the job that wrote the version, so a second
    # delivery of it adds none. ``config``, ``context``, ``metadata``: JSON. The default
    # assistant, ``agent``, is config/'s and is not stored.
    """
    CREATE TABLE assistants (
        id         TEXT PRIMARY KEY,
        owner      TEXT NOT NULL,
        latest     INTEGER NOT NULL,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
    );
    CREATE TABLE assistant_versions (
        id          TEXT NOT NULL REFERENCES assistants(id) ON DELETE CASCADE,
        version     INTEGER NOT NULL,
        graph_id    TEXT NOT NULL,
        name        TEXT NOT NULL,
        description TEXT,
        config      TEXT NOT NULL,
        context     TEXT NOT NULL,
        metadata    TEXT NOT NULL,
        created_at  TEXT NOT NULL,
        job_id      TEXT UNIQUE,
        PRIMARY KEY (id, version)
    );
    CREATE INDEX assistants_by_owner ON assistants(owner, created_at, id);
    """,
    # 12: a cron disabled (the protocol's ``enabled: false``, on a create or an update): its
    # ticks do not fire, and the tickers neither look for them nor wake for them.
    """
    ALTER TABLE crons ADD COLUMN enabled INTEGER NOT NULL DEFAULT 1;
    """,
    # 13: a tool call made as an MCP task (worker/tools/tasks.py): the task's id on its server,
    # committed as soon as the server gives it, and the last state the server reported
    # (``working``, ``completed``, ``failed``, ``cancelled``; ``forgotten``: the server no longer
    # knows it). NULL: not a task. A resume asks the server for a known task's result.
    """
    ALTER TABLE tool_calls ADD COLUMN task_id TEXT;
    ALTER TABLE tool_calls ADD COLUMN task_state TEXT;
    """,
    # 14: a cron's ``end_time`` (the protocol's): no tick after it fires; NULL: none. And
    # ``delete_threads`` (``on_run_completed: delete``): each tick's new thread is deleted once its
    # run has ended.
    """
    ALTER TABLE crons ADD COLUMN end_time BIGINT;
    ALTER TABLE crons ADD COLUMN delete_threads INTEGER NOT NULL DEFAULT 0;
    """,
)


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def iso_from_timestamp(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
