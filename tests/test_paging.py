"""The conversations listing in pages, and the indexes that keep a page's cost flat.

The query plans are read from SQLite itself (EXPLAIN QUERY PLAN on a file migrated
by the worker's own migrations), not timed: a page read through an index in its
order costs the same at 100 or 100,000 rows; a sort over every row does not.
"""

from __future__ import annotations

import base64
import json
import sqlite3
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiosqlite
import pytest
from redis.asyncio import Redis

from api import store
from shared.contracts.jobs import JobKind, RenameJob, RunJob
from shared.redis.queue import submit_rename, submit_run
from shared.storage.sqlite import migrate
from tests.fakes.ollama import FakeOllama
from tests.support.client import get_json, post_chat, read_sse
from tests.support.env import SophosEnv
from tests.support.http import async_http_client


@pytest.fixture
async def database(tmp_path: Path) -> Path:
    path = tmp_path / "sophos.db"
    conn = await aiosqlite.connect(path)
    try:
        await migrate(conn)
    finally:
        await conn.close()
    return path


@pytest.fixture
def plan(database: Path) -> Iterator[Any]:
    conn = sqlite3.connect(database)

    def explain(sql: str, params: tuple[Any, ...]) -> str:
        return " | ".join(row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params))

    yield explain
    conn.close()


def runs_sql(where: str) -> str:
    return f"{store._RUN_SQL} WHERE {where} ORDER BY {store._RUN_KEY} DESC, id DESC LIMIT ?"


def test_a_page_of_conversations_is_read_through_its_index_in_order(plan: Any) -> None:
    after = "(c.created_at, c.id) < (?, ?)"
    key = ("2026-01-01T00:00:00.000Z", "x")
    # An operator's page (every owner's): the listing index.
    first = plan(f"{store.conversation_page_sql(['1 = 1'])} LIMIT ?", (50,))
    later = plan(f"{store.conversation_page_sql(['1 = 1', after])} LIMIT ?", (*key, 50))
    for found in (first, later):
        assert "conversations_listing" in found, found
        assert "TEMP B-TREE" not in found, found  # no sort of every row
    assert "SEARCH c USING INDEX conversations_listing ((created_at,id)<(?,?))" in later
    # A user's page: their own rows only, through the owner's index, in its order.
    mine = plan(f"{store.conversation_page_sql(['c.owner = ?', after])} LIMIT ?", ("alice", *key, 50))
    assert "conversations_by_owner (owner=? AND (created_at,id)<(?,?))" in mine, mine
    assert "TEMP B-TREE" not in mine, mine


def test_the_runs_listing_filtered_by_status_or_conversation_reads_an_index_in_order(plan: Any) -> None:
    cursor = f"({store._RUN_KEY} < ? OR ({store._RUN_KEY} = ? AND id < ?))"
    by_status = plan(runs_sql(f"status = ? AND {cursor}"), ("completed", "t", "t", "x", 51))
    assert "runs_by_status (status=?)" in by_status and "TEMP B-TREE" not in by_status, by_status
    by_conversation = plan(runs_sql("conversation_id = ?"), ("c", 51))
    assert "runs_by_conversation (conversation_id=?)" in by_conversation, by_conversation
    assert "TEMP B-TREE" not in by_conversation, by_conversation


def chat(api: str, message: str, conversation: str | None = None) -> str:
    response = post_chat(api, message, conversation)
    assert response.status_code == 202, response.text
    conversation = str(response.json()["conversation"])
    read_sse(api, conversation)
    return conversation


def page(api: str, **params: Any) -> dict[str, Any]:
    listing: dict[str, Any] = get_json(api, "/api/conversations", **params)
    return listing


def ids(listing: dict[str, Any]) -> list[str]:
    return [c["id"] for c in listing["conversations"]]


def test_pages_newest_created_first_stay_stable_while_conversations_are_added_and_updated(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    start_worker(sophos_env)
    api = start_api(sophos_env).url
    created = [chat(api, f"conversation {i}") for i in range(7)]
    everything = ids(page(api))
    assert everything == list(reversed(created))
    assert page(api)["nextCursor"] is None  # one page (default limit 50)

    pages = [page(api, limit=3)]
    assert ids(pages[0]) == everything[:3] and pages[0]["nextCursor"]
    # While paging: a new conversation, and the oldest one (on the last page) updated.
    newest = chat(api, "arrives while paging")
    chat(api, "an update to the oldest", created[0])
    while pages[-1]["nextCursor"] is not None:
        pages.append(page(api, limit=3, cursor=pages[-1]["nextCursor"]))
    assert [len(ids(p)) for p in pages] == [3, 3, 1]
    assert [c for p in pages for c in ids(p)] == everything  # nothing skipped, nothing twice
    by_id = {c["id"]: c for p in pages for c in p["conversations"]}
    updated = by_id[created[0]]
    assert updated["messageCount"] == 4 and updated["updatedAt"] > updated["createdAt"]
    assert ids(page(api, limit=1)) == [newest]
    # A page that ends exactly at the last conversation says so.
    assert page(api, limit=8)["nextCursor"] is None
    assert page(api, limit=7)["nextCursor"] is not None


def test_a_queued_first_run_is_listed_in_its_place_and_once(
    sophos_env: SophosEnv, start_api, start_worker, model: FakeOllama
) -> None:
    api = start_api(sophos_env).url  # no worker yet: the runs stay queued, known to Redis only
    queued = []
    for i in range(3):
        response = post_chat(api, f"queued {i}")
        assert response.status_code == 202
        queued.append(response.json()["conversation"])
    first = page(api, limit=2)
    assert ids(first) == [queued[2], queued[1]]
    assert all(c["status"] == "queued" for c in first["conversations"])
    start_worker(sophos_env)
    for conversation in queued:
        read_sse(api, conversation)
    # Recorded by the worker now, under the key they were listed by: the next page goes on.
    rest = page(api, limit=2, cursor=first["nextCursor"])
    assert ids(rest) == [queued[0]] and rest["nextCursor"] is None
    assert ids(page(api)) == list(reversed(queued))


def nested_cursor(depth: int) -> str:
    raw = json.dumps(["2026-01-01T00:00:00.000Z", "x"])
    return base64.urlsafe_b64encode(("[" * depth + raw + "]" * depth).encode()).decode()


@pytest.mark.parametrize("path", ["/api/conversations", "/api/runs"])
def test_limit_and_cursor_out_of_bounds_are_refused_naming_them(
    sophos_env: SophosEnv, start_api, path: str
) -> None:
    api = start_api(sophos_env).url
    most = 200 if path == "/api/conversations" else 500
    for limit in ("0", "-1", str(most + 1), "abc", "1.5", "9" * 40):
        error = get_json(api, path, limit=limit, expect=400)["error"]
        assert error["code"] == "BAD_REQUEST" and "limit" in error["message"], (limit, error)
    assert get_json(api, path, limit=str(most))  # the bound itself is taken
    for cursor in ("not-a-cursor", nested_cursor(2500), nested_cursor(3), "A" * 5000, "%00"):
        error = get_json(api, path, cursor=cursor, expect=400)["error"]
        assert error["code"] == "BAD_REQUEST" and "cursor" in error["message"], (cursor[:20], error)


async def test_a_long_queue_is_paged_by_window_with_every_runs_position(
    sophos_env: SophosEnv, start_api, redis: Redis
) -> None:
    """300 runs queued (no worker), a rename among them: pages of /api/runs join into the whole
    queue newest first, each run's position counts the runs ahead (the rename is no run), one run
    read alone and one conversation's filter say the same, and a scrape counts them all."""
    api = start_api(sophos_env).url
    base = time.time() - 60
    queued: list[tuple[str, str]] = []
    for i in range(300):
        run, conversation = str(uuid.uuid4()), str(uuid.uuid4())
        job = RunJob(
            run_id=run, conversation_id=conversation, kind=JobKind.RUN, message=f"queued {i}",
            enqueued_at=base + i * 0.01, new_conversation=True,
        )
        assert await submit_run(redis, job, title=f"queued {i}") is None
        queued.append((run, conversation))
        if i == 100:
            rename = RenameJob(conversation, "renamed", f"rename:{uuid.uuid4()}", base + i * 0.01 + 0.005)
            await submit_rename(redis, rename)
    listed: list[dict[str, Any]] = []
    listing = get_json(api, "/api/runs", limit=70)
    listed += listing["runs"]
    while "nextCursor" in listing:
        listing = get_json(api, "/api/runs", limit=70, cursor=listing["nextCursor"])
        listed += listing["runs"]
    assert [r["id"] for r in listed] == [run for run, _ in reversed(queued)]
    assert [r["position"] for r in listed] == list(range(299, -1, -1))
    assert all(r["status"] == "queued" for r in listed)
    run, conversation = queued[150]
    assert get_json(api, f"/api/runs/{run}")["position"] == 150
    alone = get_json(api, "/api/runs", conversation=conversation)["runs"]
    assert [(r["id"], r["position"]) for r in alone] == [(run, 150)]
    async with async_http_client(base_url=api, timeout=10) as http:
        scraped = (await http.get("/metrics")).text
    assert "sophos_runs_queued 300.0" in scraped
    assert "sophos_runs_waiting_for_thread 0.0" in scraped
