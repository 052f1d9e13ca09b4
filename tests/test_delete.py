"""DELETE /api/conversations/{id}: the worker deletes; a delete and a run exclude each other.

Real worker, API, Redis and SQLite file; the model is the fake Ollama, whose ``Hang``
reply holds a run (and with one job at a time, the worker) for as long as a test needs.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import httpx
import redis as redis_sync

from shared.redis.keys import ACTIVE_RUNS, events_key, model_call_key, run_key
from tests.fakes.ollama import FakeOllama, Hang, Text
from tests.support.client import get_json, post_chat, read_sse, wait_for
from tests.support.env import SophosEnv
from tests.support.http import http_client


def chat(api: str, message: str, conversation: str | None = None) -> tuple[str, str]:
    response = post_chat(api, message, conversation)
    assert response.status_code == 202, response.text
    return response.json()["conversation"], response.json()["run"]


def delete(api: str, conversation: str) -> httpx.Response:
    with http_client(base_url=api, timeout=15) as http:
        return http.delete(f"/api/conversations/{conversation}")


def error_code(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    return str(response.json()["error"]["code"])


def thread_rows(database: Path, conversation: str) -> dict[str, int]:
    """What the file holds of the conversation, table by table (read beside the worker)."""
    conn = sqlite3.connect(f"{database.as_uri()}?mode=ro", uri=True)
    try:
        sql = "SELECT count(*) FROM {} WHERE {} = ?"
        return {
            table: conn.execute(sql.format(table, column), (conversation,)).fetchone()[0]
            for table, column in (
                ("checkpoints", "thread_id"),
                ("writes", "thread_id"),
                ("runs", "conversation_id"),
                ("conversations", "id"),
            )
        }
    finally:
        conn.close()


def listed(api: str) -> list[str]:
    return [c["id"] for c in get_json(api, "/api/conversations", limit=200)["conversations"]]


def test_delete_removes_thread_rows_and_events_and_every_route_answers_404(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama, redis_sync_client: redis_sync.Redis
) -> None:
    start_worker(sophos_env)
    api = start_api(sophos_env).url
    model.script(Text("first answer"), Text("second answer"), Text("kept"))
    conversation, first = chat(api, "hello")
    assert read_sse(api, conversation).text == "first answer"
    _, second = chat(api, "again", conversation)
    assert read_sse(api, conversation).text == "second answer"
    other, _ = chat(api, "another conversation")
    read_sse(api, other)
    before = thread_rows(sophos_env.database_path, conversation)
    assert before["checkpoints"] > 0 and before["writes"] > 0 and before["runs"] == 2
    assert redis_sync_client.exists(events_key(first), events_key(second)) == 2
    assert redis_sync_client.exists(model_call_key(conversation)) == 1  # its last model call's mark

    response = delete(api, conversation)
    assert response.status_code == 204, response.text
    assert response.content == b""

    assert thread_rows(sophos_env.database_path, conversation) == {
        "checkpoints": 0,
        "writes": 0,
        "runs": 0,
        "conversations": 0,
    }
    kept = (events_key(first), events_key(second), run_key(first), run_key(second))
    assert redis_sync_client.exists(*kept, model_call_key(conversation)) == 0
    assert redis_sync_client.hget(ACTIVE_RUNS, conversation) is None
    assert listed(api) == [other]
    with http_client(base_url=api, timeout=10) as http:
        for path in (
            f"/api/conversations/{conversation}",
            f"/api/conversations/{conversation}/export",
            f"/api/conversations/{conversation}/export?format=jsonl",
            f"/api/chat?conversation={conversation}",
            f"/api/runs/{first}",
            f"/api/runs/{second}",
        ):
            assert error_code(http.get(path), 404) == "NOT_FOUND", path
    assert get_json(api, "/api/runs", conversation=conversation)["runs"] == []
    # The same id is unknown for a new message, and for a second delete.
    assert error_code(post_chat(api, "are you there?", conversation), 404) == "NOT_FOUND"
    assert error_code(delete(api, conversation), 404) == "NOT_FOUND"
    # The other conversation is untouched.
    assert thread_rows(sophos_env.database_path, other)["checkpoints"] > 0
    assert len(get_json(api, f"/api/conversations/{other}")["messages"]) == 2


def test_delete_refused_while_a_run_is_queued_or_running(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    start_worker(sophos_env)
    api = start_api(sophos_env).url
    model.script(Text("first answer"))
    conversation, _ = chat(api, "hello")
    read_sse(api, conversation)

    slow = Hang(text="thinking ")
    model.script(slow)
    _, running = chat(api, "a long one", conversation)
    slow.wait_started()
    refused = delete(api, conversation)
    assert error_code(refused, 409) == "SESSION_IN_PROGRESS"
    assert running in refused.json()["error"]["message"]
    # A conversation whose first run is still queued (behind the slow one) cannot be deleted either.
    queued_conversation, _ = chat(api, "waiting in the queue")
    assert error_code(delete(api, queued_conversation), 409) == "SESSION_IN_PROGRESS"

    slow.release()
    assert read_sse(api, conversation).types[-1] == "end"
    read_sse(api, queued_conversation)
    assert delete(api, conversation).status_code == 204
    assert delete(api, queued_conversation).status_code == 204
    assert listed(api) == []


def test_a_delete_the_worker_has_not_taken_yet_answers_202_and_holds_off_new_runs(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    start_worker(sophos_env)
    api = start_api(sophos_env).url
    model.script(Text("answer"))
    conversation, _ = chat(api, "to be deleted")
    read_sse(api, conversation)
    # The worker takes one job at a time: a run of another conversation holds it.
    slow = Hang(text="busy ")
    model.script(slow)
    busy, _ = chat(api, "keeps the worker busy")
    slow.wait_started()

    accepted = delete(api, conversation)
    assert accepted.status_code == 202, accepted.text
    assert accepted.json() == {"conversation": conversation, "status": "deleting"}
    assert conversation not in listed(api)
    # No run can be accepted for it meanwhile, and a second delete is the same delete.
    assert error_code(post_chat(api, "one more thing", conversation), 409) == "SESSION_IN_PROGRESS"
    assert delete(api, conversation).status_code == 202

    slow.release()
    read_sse(api, busy)
    # Hidden from the first 202 on; a DELETE that comes while the worker deletes is that same
    # delete (202, or 204 once it is done), and one after it finds nothing (404).
    wait_for(
        lambda: delete(api, conversation).status_code == 404,
        timeout=20,
        message="the worker to delete the conversation",
    )
    assert httpx.get(f"{api}/api/conversations/{conversation}", timeout=5).status_code == 404
    assert thread_rows(sophos_env.database_path, conversation)["checkpoints"] == 0
    assert error_code(delete(api, conversation), 404) == "NOT_FOUND"
    assert listed(api) == [busy]


def test_delete_with_no_worker_is_done_when_one_starts(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    worker = start_worker(sophos_env)
    api = start_api(sophos_env).url
    model.script(Text("answer"))
    conversation, _ = chat(api, "hello")
    read_sse(api, conversation)
    worker.stop()

    assert delete(api, conversation).status_code == 202
    start_worker(sophos_env)
    wait_for(
        lambda: (
            conversation not in listed(api)
            and thread_rows(sophos_env.database_path, conversation)
            == {"checkpoints": 0, "writes": 0, "runs": 0, "conversations": 0}
        ),
        timeout=20,
        message="the new worker to delete the conversation",
    )


def test_delete_refuses_bad_and_unknown_ids(sophos_env: SophosEnv, start_worker, start_api) -> None:
    start_worker(sophos_env)
    api = start_api(sophos_env).url
    for bad in ("not-a-uuid", "1" * 300, "00000000-0000-0000-0000-00000000000g"):
        response = delete(api, bad)
        assert error_code(response, 400) == "BAD_REQUEST", bad
        assert "conversation id" in response.json()["error"]["message"]
    assert error_code(delete(api, "00000000-0000-4000-8000-000000000000"), 404) == "NOT_FOUND"


def test_delete_takes_the_runs_cancelled_while_queued_with_it(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    start_worker(sophos_env)
    api = start_api(sophos_env).url
    model.script(Text("answer"))
    conversation, _ = chat(api, "hello")
    read_sse(api, conversation)
    slow = Hang(text="busy ")
    model.script(slow)
    busy, busy_run = chat(api, "keeps the worker busy")
    slow.wait_started()
    cancelled = []
    with http_client(base_url=api, timeout=10) as http:
        for message in ("never mind", "never mind again"):
            _, run = chat(api, message, conversation)
            assert http.post(f"/api/runs/{run}/cancel").status_code == 200
            cancelled.append(run)
    listed_cancelled = get_json(api, "/api/runs", status="cancelled")["runs"]
    assert sorted(r["id"] for r in listed_cancelled) == sorted(cancelled)
    slow.release()
    read_sse(api, busy)

    assert delete(api, conversation).status_code == 204
    assert get_json(api, "/api/runs", status="cancelled")["runs"] == []
    for run in cancelled:
        assert error_code(httpx.get(f"{api}/api/runs/{run}", timeout=5), 404) == "NOT_FOUND"
    assert [r["id"] for r in get_json(api, "/api/runs")["runs"]] == [busy_run]
