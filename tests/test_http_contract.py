"""The HTTP contract: error envelope, order of checks, conflicts, limits."""

from __future__ import annotations

import uuid

import httpx
import pytest

from tests.fakes.ollama import FakeOllama, Hang, Text
from tests.support.client import get_json, post_chat, read_sse
from tests.support.env import SophosEnv


def error_of(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and body["error"]["code"] == code, body
    assert body["error"]["message"]
    return str(body["error"]["message"])


def raw_post(api_url: str, content: bytes, content_type: str = "application/json") -> httpx.Response:
    with httpx.Client(base_url=api_url, trust_env=False, timeout=10) as http:
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

    with httpx.Client(base_url=url, trust_env=False, timeout=10) as http:
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


def test_simultaneous_requests_for_one_conversation_start_one_run(
    sophos_env: SophosEnv, start_api, model: FakeOllama
) -> None:
    api = start_api(sophos_env)
    first = post_chat(api.url, "hello")
    conversation = first.json()["conversation"]
    # Posted while the first run is queued: all must be refused, by an atomic claim.
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(lambda i: post_chat(api.url, f"m{i}", conversation).status_code, range(20)))
    assert answers == [409] * 20


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
    import concurrent.futures

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
