"""The HTTP contract: error envelope, order of checks, conflicts, limits."""

from __future__ import annotations

import concurrent.futures
import uuid
from typing import cast

import httpx
import pytest
import redis as redis_sync

from shared.redis.keys import ACTIVE_RUNS, QUEUE_NAME
from tests.fakes.ollama import FakeOllama, Hang, Text
from tests.support.client import get_json, post_chat, read_sse, wait_for
from tests.support.env import SophosEnv
from tests.support.http import http_client


def error_of(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and body["error"]["code"] == code, body
    assert body["error"]["message"]
    return str(body["error"]["message"])


def raw_post(api_url: str, content: bytes, content_type: str = "application/json") -> httpx.Response:
    with http_client(base_url=api_url, timeout=10) as http:
        return http.post("/api/chat", content=content, headers={"Content-Type": content_type})


@pytest.fixture
def api_only(sophos_env: SophosEnv, start_api) -> SophosEnv:
    """An API with no worker: runs stay queued."""
    start_api(sophos_env.with_(MAX_BODY_BYTES=4096, MAX_MESSAGE_CHARS=100))
    return sophos_env


def test_bad_requests_name_the_problem(api_only: SophosEnv) -> None:
    url = api_only.api_url
    unknown = str(uuid.uuid4())
    assert "JSON" in error_of(raw_post(url, b"{not json"), 400, "BAD_REQUEST")
    error_of(raw_post(url, b"[1, 2]"), 400, "BAD_REQUEST")
    error_of(raw_post(url, b'{"message": 5}'), 400, "BAD_REQUEST")
    assert "message" in error_of(post_chat(url, ""), 400, "BAD_REQUEST")
    assert "message" in error_of(post_chat(url), 400, "BAD_REQUEST")
    error_of(post_chat(url, "x" * 101), 400, "BAD_REQUEST")
    assert "conversation" in error_of(post_chat(url, resume=True), 400, "BAD_REQUEST")
    error_of(post_chat(url, "hi", "not-a-uuid"), 400, "BAD_REQUEST")
    error_of(post_chat(url, "hi", "../x"), 400, "BAD_REQUEST")
    error_of(post_chat(url, conversation="../x", resume=True), 400, "BAD_REQUEST")
    # Order of checks: a bad message is reported before a bad id.
    assert "message" in error_of(post_chat(url, "", "not-a-uuid"), 400, "BAD_REQUEST")
    error_of(post_chat(url, "hi", unknown), 404, "NOT_FOUND")
    error_of(post_chat(url, conversation=unknown, resume=True), 404, "NOT_FOUND")
    error_of(raw_post(url, b'{"message": "' + b"a" * 5000 + b'"}'), 413, "PAYLOAD_TOO_LARGE")

    with http_client(base_url=url, timeout=10) as http:
        error_of(http.get("/api/conversations/nope"), 400, "BAD_REQUEST")
        error_of(http.get(f"/api/conversations/{unknown}"), 404, "NOT_FOUND")
        error_of(http.get(f"/api/conversations/{unknown}/export"), 404, "NOT_FOUND")
        error_of(http.get("/api/chat", params={"conversation": "nope"}), 400, "BAD_REQUEST")
        error_of(http.get("/api/chat"), 400, "BAD_REQUEST")
        error_of(http.get("/api/chat", params={"conversation": unknown}), 404, "NOT_FOUND")
        error_of(http.get("/api/runs/nope"), 400, "BAD_REQUEST")
        error_of(http.get(f"/api/runs/{unknown}"), 404, "NOT_FOUND")
        error_of(http.get("/api/nothing-here"), 404, "NOT_FOUND")
        assert http.get("/api/healthz").status_code == 200
        assert http.get("/schema/openapi.json").json()["paths"]["/api/chat"]
    # None of this stored anything.
    assert get_json(url, "/api/conversations")["conversations"] == []


def test_queued_run_is_listed_and_blocks_a_second_message(api_only: SophosEnv) -> None:
    url = api_only.api_url
    first = post_chat(url, "first")
    assert first.status_code == 202
    conversation, run = first.json()["conversation"], first.json()["run"]
    error_of(post_chat(url, "second", conversation), 409, "SESSION_IN_PROGRESS")
    error_of(post_chat(url, conversation=conversation, resume=True), 409, "SESSION_IN_PROGRESS")

    listing = get_json(url, "/api/conversations")["conversations"]
    assert [(c["id"], c["status"], c["title"]) for c in listing] == [(conversation, "queued", "first")]
    info = get_json(url, f"/api/runs/{run}")
    assert info["status"] == "queued" and info["position"] == 0
    assert [r["id"] for r in get_json(url, "/api/runs", status="queued")["runs"]] == [run]
    ready = get_json(url, "/api/readyz", expect=503)
    assert ready["checks"]["worker"] is False


def submits_waiting(redis_client: redis_sync.Redis, api_pid: int) -> int:
    """How many of the API's Redis connections are held at a script (EVAL/EVALSHA) by a pause."""
    clients = cast(list[dict[str, str]], redis_client.client_list())
    return sum(
        1
        for client in clients
        if client.get("name") == f"sophos-api-{api_pid}"
        and client.get("cmd") in ("eval", "evalsha")
        and "b" in client.get("flags", "")
    )


def test_simultaneous_requests_for_one_conversation_start_one_run(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama, redis_sync_client: redis_sync.Redis
) -> None:
    """Twenty messages for one idle conversation, each past the API's own check: one run.

    The API refuses a message for a conversation it sees held before it runs the submit
    script; requests sent one after another would mostly stop there, and a claim that was not
    atomic would go unnoticed. So Redis's writes are paused (CLIENT PAUSE WRITE: reads go on,
    scripts wait) while the twenty are sent: each finds the conversation free and waits at the
    script, and once all twenty wait, the pause ends and their scripts run back to back.
    """
    # The rate limit's count is a write: paused, it would hold requests before the API's check.
    env = sophos_env.with_(RATE_LIMIT_PER_MINUTE=0)
    worker = start_worker(env)
    api = start_api(env)
    model.script(Text("done"))
    conversation = post_chat(api.url, "seed").json()["conversation"]
    assert read_sse(api.url, conversation)[-1].event == "end"
    worker.stop()  # nothing else writes to Redis now; the run accepted below stays queued

    pool = concurrent.futures.ThreadPoolExecutor(20)
    redis_sync_client.client_pause(30_000, all=False)
    try:
        answers = [pool.submit(post_chat, api.url, f"m{i}", conversation, timeout=30) for i in range(20)]
        wait_for(lambda: submits_waiting(redis_sync_client, api.pid) == 20, 20,
                 message=lambda: f"20 submit scripts waiting ({submits_waiting(redis_sync_client, api.pid)})")
    finally:
        redis_sync_client.client_unpause()
        pool.shutdown(wait=True)
    responses = [answer.result() for answer in answers]
    assert sorted(r.status_code for r in responses) == [202] + [409] * 19, [r.text for r in responses]
    accepted = next(r.json()["run"] for r in responses if r.status_code == 202)
    assert redis_sync_client.hget(ACTIVE_RUNS, conversation) == accepted
    assert redis_sync_client.zrange(QUEUE_NAME, 0, -1) == [accepted]


def test_fresh_conversation_race_and_running_conflict(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    start_worker(sophos_env)
    api = start_api(sophos_env)
    model.script(Text("done"))
    conversation = post_chat(api.url, "seed").json()["conversation"]
    assert read_sse(api.url, conversation)[-1].event == "end"

    hang = Hang(text="working ")
    model.script(hang)
    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(lambda i: post_chat(api.url, f"m{i}", conversation), range(20)))
    assert sorted(a.status_code for a in answers) == [202] + [409] * 19
    hang.wait_started(15)
    error_of(post_chat(api.url, "while running", conversation), 409, "SESSION_IN_PROGRESS")
    assert get_json(api.url, "/api/conversations")["conversations"][0]["status"] == "running"
    hang.release()
    events = read_sse(api.url, conversation)
    assert events[-1].event == "end" and events.text == "working "
    error_of(post_chat(api.url, conversation=conversation, resume=True), 409, "RUN_NOT_RESUMABLE")
    assert model.calls == 2
