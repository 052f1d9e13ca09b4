"""Helpers for the fault suites: what the user sees, what the database holds, what ran.

A fault test compares a run that was hit by a fault with the same script run
without one, so the helpers here turn both into comparable values: the
transcript without its generated ids, the executions counted at the model server
and in the tools' log, and SQLite's own verdict on the file.
"""

from __future__ import annotations

import collections
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis as redis_sync

from shared.redis.keys import ACTIVE_RUNS, QUEUE_NAME
from tests.fakes.ollama import FakeOllama
from tests.support.client import SseEvents, chat, get_json, read_sse, tool_calls, wait_for
from tests.support.http import http_client
from tests.support.metrics import scrape

#: The one ``chat()`` helper, under the name the fault tests use: POST /api/chat, assert 202,
#: return ``(conversation, run)``.
accepted = chat


def transcript(api_url: str, conversation: str) -> list[tuple[Any, ...]]:
    """The conversation's messages as the API shows them, minus generated ids."""
    detail = get_json(api_url, f"/api/conversations/{conversation}")
    shown = []
    for m in detail["messages"]:
        calls = tuple((c["name"], tuple(sorted(c["arguments"].items()))) for c in m.get("toolCalls", []))
        shown.append((m["role"], m["content"], calls, m.get("name"), m.get("status")))
    return shown


def integrity(database: Path) -> str:
    """``PRAGMA integrity_check`` of the file, read-only (beside a live or dead writer)."""
    conn = sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=10)
    try:
        return "; ".join(str(row[0]) for row in conn.execute("PRAGMA integrity_check"))
    finally:
        conn.close()


#: On PostgreSQL: checkpoints whose parent, and pending writes whose checkpoint, is missing
#: (a write that landed without what it belongs to).
_ORPHANS_SQL = """
SELECT
  (SELECT count(*) FROM checkpoints c WHERE c.parent_checkpoint_id IS NOT NULL AND NOT EXISTS (
     SELECT 1 FROM checkpoints p WHERE p.thread_id = c.thread_id AND p.checkpoint_ns = c.checkpoint_ns
       AND p.checkpoint_id = c.parent_checkpoint_id)),
  (SELECT count(*) FROM checkpoint_writes w WHERE NOT EXISTS (
     SELECT 1 FROM checkpoints c WHERE c.thread_id = w.thread_id AND c.checkpoint_ns = w.checkpoint_ns
       AND c.checkpoint_id = w.checkpoint_id)),
  (SELECT count(*) FROM runs WHERE status = 'running' AND lease_owner IS NULL)
"""


def database_integrity(env: Any) -> str:
    """``"ok"`` when the test's database is whole: SQLite's ``integrity_check`` of the file, or
    on PostgreSQL (``DATABASE_URL``) no orphaned checkpoint or write and no running run without
    an owner."""
    url = env.get("DATABASE_URL")
    if not url:
        return integrity(env.database_path)
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute(_ORPHANS_SQL).fetchone()
    assert row is not None
    names = ("checkpoints without parent", "writes without checkpoint", "unowned running runs")
    orphans = dict(zip(names, row, strict=True))
    return "ok" if not any(orphans.values()) else repr(orphans)


def ledger_rows(env: Any, conversation: str) -> list[dict[str, Any]]:
    """The conversation's rows of the ledger (``tool_calls``), on whichever database the test uses."""
    sql = (
        "SELECT tool_call_id, tool, arguments, idempotency_key, attempt, state, status, result, run_id,"
        " task_id, task_state FROM tool_calls WHERE conversation_id = {} ORDER BY intent_at"
    )
    columns = ("tool_call_id", "tool", "arguments", "key", "attempt", "state", "status", "result", "run_id",
               "task_id", "task_state")
    url = env.get("DATABASE_URL")
    rows: list[Any]
    if url:
        import psycopg

        with psycopg.connect(url) as pg:
            rows = pg.execute(sql.format("%s"), (conversation,)).fetchall()
    else:
        conn = sqlite3.connect(f"{env.database_path.as_uri()}?mode=ro", uri=True)
        try:
            rows = conn.execute(sql.format("?"), (conversation,)).fetchall()
        finally:
            conn.close()
    return [dict(zip(columns, row, strict=True)) for row in rows]


#: the counters of tool and model calls, and their labels (none for a plain counter)
_CALL_COUNTERS = {"sophos_tool_calls_total": "outcome", "sophos_tool_calls_repeated_total": "reason",
                  "sophos_model_calls_repeated_total": None,
                  "sophos_tool_calls_answered_from_task_total": None}


def call_counters(api: str) -> collections.Counter[str]:
    """``sophos_tool_calls_total`` by outcome (``"sophos_tool_calls_total:answered"``),
    ``sophos_tool_calls_repeated_total`` by reason, ``sophos_model_calls_repeated_total`` and
    ``sophos_tool_calls_answered_from_task_total``."""
    found: collections.Counter[str] = collections.Counter()
    for (name, labels), value in scrape(api).items():
        if name in _CALL_COUNTERS:
            label = _CALL_COUNTERS[name]
            found[f"{name}:{dict(labels)[label]}" if label else name] = int(value)
    return found


def recorded_after_crash(api_url: str, run: str, timeout: float = 20) -> dict[str, Any]:
    """The run's record once a live worker has recorded it after its worker died: at start-up
    on SQLite, within the lease plus one pass on PostgreSQL."""
    return wait_for(
        lambda: (info := get_json(api_url, f"/api/runs/{run}"))["status"] != "running" and info,
        timeout=timeout, message=f"run {run} recorded after the crash",
    )


@dataclass(frozen=True)
class Executions:
    """What was executed: chat requests at the model server, calls per tool."""

    model: int
    tools: dict[str, int]

    @classmethod
    def now(cls, model: FakeOllama, tools_log: Path) -> Executions:
        counted = collections.Counter(entry["tool"] for entry in tool_calls(tools_log))
        return cls(model.calls, dict(counted))

    def __sub__(self, other: Executions) -> Executions:
        tools = {t: n - other.tools.get(t, 0) for t, n in self.tools.items()}
        return Executions(self.model - other.model, {t: n for t, n in tools.items() if n})


def queue_is_clean(redis_url: str, conversation: str, settle: float = 5.0) -> list[str]:
    """Problems that would block or re-run the conversation: claims, queued jobs, arq markers.

    Looked at until there are none, for at most ``settle`` seconds: arq removes a job
    after its function returns, a moment after the client has seen the run's last event.
    """
    client = redis_sync.Redis.from_url(redis_url, decode_responses=True)
    deadline = time.monotonic() + settle
    try:
        while True:
            problems = []
            if (holder := client.hget(ACTIVE_RUNS, conversation)) is not None:
                problems.append(f"conversation still claimed by {holder}")
            if queued := client.zrange(QUEUE_NAME, 0, -1):
                problems.append(f"jobs still queued: {queued}")
            for pattern in ("arq:in-progress:*", "arq:retry:*"):
                if keys := client.keys(pattern):
                    problems.append(f"stale arq keys: {keys}")
            if not problems or time.monotonic() > deadline:
                return problems
            time.sleep(0.05)
    finally:
        client.close()


class DatabaseLock:
    """Another process holding the database's write lock (``BEGIN IMMEDIATE``) until released."""

    def __init__(self, database: Path) -> None:
        script = (
            "import sqlite3, sys\n"
            "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "c.execute('BEGIN IMMEDIATE')\n"
            "print('locked', flush=True)\n"
            "sys.stdin.readline()\n"
            "c.execute('ROLLBACK')\n"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", script, str(database)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.strip() == "locked", f"lock holder failed: {line!r}"
        self.taken_at = time.monotonic()

    def release(self) -> float:
        """Let go of the lock; return how long it was held (seconds)."""
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write("\n")
            self.proc.stdin.flush()
            self.proc.wait(10)
        return time.monotonic() - self.taken_at

    def __enter__(self) -> DatabaseLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
        if self.proc.poll() is None:
            self.proc.kill()


def execute(database: Path, sql: str) -> None:
    """One statement from another connection, as an operator's sqlite3 shell would."""
    conn = sqlite3.connect(database, timeout=10)
    try:
        conn.execute(sql)
        conn.commit()
    finally:
        conn.close()


def decide(api: str, conversation: str, decisions: list[dict[str, str]]) -> SseEvents:
    """Send the decisions on the calls a waiting conversation asks about; the decision run's events."""
    with http_client(base_url=api, timeout=10.0) as http:
        decided = http.post("/api/chat", json={"conversation": conversation, "decisions": decisions})
    assert decided.status_code == 202, decided.text
    return read_sse(api, conversation)


def asked_calls(events: SseEvents) -> dict[str, dict[str, Any]]:
    """The approval event's requests by tool name; the run ended waiting."""
    assert events.types[-2:] == ["approval", "end"] and events[-1].data["status"] == "waiting", events.types
    return {r["name"]: r for r in events.of("approval")[0].data["requests"]}
