"""Simultaneous and retried submissions: one run, whatever the client does twice.

Without an ``Idempotency-Key`` the second of two simultaneous requests is refused
(409); with one, every retry of the request gets the first answer, however close
together or late (within the key's 24 h) they come.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import redis as redis_sync

from shared.redis.keys import IDEMPOTENCY_TTL_SECONDS, idempotency_key
from tests.fakes.ollama import Drop, FakeOllama, Hang, Status, Text
from tests.support.client import chat_body, get_json, read_sse
from tests.support.env import SophosEnv
from tests.support.http import http_client

pytestmark = pytest.mark.fault

NO_LIMITS = {"RATE_LIMIT_PER_MINUTE": 0, "MAX_STREAMS_PER_CLIENT": 0}


def post(api_url: str, key: str | bytes | None = None, message: str | None = None,
         conversation: str | None = None, resume: bool = False) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key is not None else {}
    with http_client(base_url=api_url, timeout=20) as http:
        return http.post("/api/chat", json=chat_body(message, conversation, resume), headers=headers)


def at_once(n: int, request) -> list[httpx.Response]:
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda _: request(), range(n)))


def answers(responses: list[httpx.Response]) -> set[tuple[int, str, str]]:
    return {(r.status_code, r.json().get("conversation", ""), r.json().get("run", "")) for r in responses}


def test_retries_and_simultaneous_requests_start_one_run(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    env = sophos_env.with_(**NO_LIMITS)
    start_worker(env)
    api = start_api(env)

    # A new conversation whose run fails: resumable, and the retry of its request changes nothing.
    model.script(Status(500, {"error": "model crashed"}))
    first = post(api.url, "key-0", "hello")
    assert first.status_code == 202
    conversation, run = first.json()["conversation"], first.json()["run"]
    assert read_sse(api.url, conversation)[-1].data["code"] == "MODEL_UNAVAILABLE"
    retried = post(api.url, "key-0", "hello")
    assert (retried.status_code, retried.json()) == (202, first.json())
    assert model.calls == 1
    reused = post(api.url, "key-0", "hello, but different")
    assert reused.status_code == 422 and reused.json()["error"]["code"] == "IDEMPOTENCY_KEY_REUSED"
    for bad in ("", "x" * 256, "naïve".encode(), "two words"):
        refused = post(api.url, bad, "hello")
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "BAD_REQUEST", bad
    with redis_sync.Redis.from_url(env.redis_url) as client:
        assert 0 < client.ttl(idempotency_key("key-0", "local")) <= IDEMPOTENCY_TTL_SECONDS

    # 20 simultaneous resumes with one key: one run, all told about it.
    model.script(Drop())  # fails again: still resumable afterwards
    resumes = at_once(20, lambda: post(api.url, "key-1", conversation=conversation, resume=True))
    (status, same_conversation, resumed), = answers(resumes)
    assert (status, same_conversation) == (202, conversation) and resumed != run
    assert read_sse(api.url, conversation)[-1].data["run"] == resumed
    assert model.calls == 2

    # 20 simultaneous resumes without a key: exactly one is accepted.
    hang = Hang(then=Text("finally done"))
    model.script(hang)
    resumes = at_once(20, lambda: post(api.url, conversation=conversation, resume=True))
    assert sorted(r.status_code for r in resumes) == [202] + [409] * 19
    assert {r.json()["error"]["code"] for r in resumes if r.status_code == 409} <= {
        "SESSION_IN_PROGRESS", "RUN_NOT_RESUMABLE",
    }
    hang.release()
    assert read_sse(api.url, conversation).text == "finally done"
    assert model.calls == 3

    # A follow-up message sent 20 times at once with one key: recorded once.
    model.script(Text("answered once"))
    follow = at_once(20, lambda: post(api.url, "key-2", "one more thing", conversation))
    assert len(answers(follow)) == 1 and follow[0].status_code == 202
    assert read_sse(api.url, conversation).text == "answered once"
    messages = get_json(api.url, f"/api/conversations/{conversation}")["messages"]
    assert [m["content"] for m in messages if m["role"] == "user"] == ["hello", "one more thing"]

    # A new conversation, 20 times at once with one key: one conversation, one run.
    model.script(Text("just one"))
    news = at_once(20, lambda: post(api.url, "key-3", "start something"))
    (status, created, _), = answers(news)
    assert status == 202 and read_sse(api.url, created).text == "just one"
    listed = [c["id"] for c in get_json(api.url, "/api/conversations")["conversations"]]
    assert sorted(listed) == sorted([conversation, created])
    assert model.calls == 5
    runs = get_json(api.url, "/api/runs", limit=100)["runs"]
    assert len(runs) == 5  # hello, two resumes, the follow-up, the new conversation
