"""Deleted means gone: no replayed answer names a deleted conversation, and retention
gets past the conversations it cannot delete now.

Real worker, API, Redis and SQLite. "Idle for days" is written into the conversation's
``updated_at`` beside the worker, as tests/test_retention.py does.
"""

from __future__ import annotations

import pytest

from tests.fakes.ollama import FakeOllama, Hang, Text
from tests.support.client import read_sse, wait_for
from tests.support.env import SophosEnv
from tests.test_delete import chat, delete, error_code
from tests.test_idempotency import NO_LIMITS, post
from tests.test_retention import _age, _expiring, _status

pytestmark = pytest.mark.fault


def test_a_retry_after_the_delete_is_not_found_instead_of_the_first_answer(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    start_worker(sophos_env)
    api = start_api(sophos_env).url
    model.script(Text("first"), Text("second"))
    created = post(api, "creates-it", "hello")
    assert created.status_code == 202, created.text
    conversation = created.json()["conversation"]
    assert read_sse(api, conversation)[-1].data["status"] == "completed"
    followed = post(api, "follows-up", "and again", conversation)
    assert followed.status_code == 202, followed.text
    assert read_sse(api, conversation)[-1].data["status"] == "completed"
    # Before the delete, a retry gets the first answer, as always.
    assert post(api, "follows-up", "and again", conversation).json() == followed.json()

    assert delete(api, conversation).status_code == 204
    # Neither the request that created it nor the message sent to it names it again,
    # and neither starts anything.
    assert error_code(post(api, "creates-it", "hello"), 404) == "NOT_FOUND"
    assert error_code(post(api, "follows-up", "and again", conversation), 404) == "NOT_FOUND"
    # A key reused for another request is still refused as such.
    assert error_code(post(api, "creates-it", "something else"), 422) == "IDEMPOTENCY_KEY_REUSED"
    assert model.calls == 2


def test_retention_gets_past_the_oldest_conversations_it_cannot_delete_now(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    worker = start_worker(sophos_env.with_(CONVERSATION_RETENTION_DAYS=1))
    api = start_api(sophos_env.with_(**NO_LIMITS)).url
    conversations = []
    for n in range(11):
        conversation, _ = chat(api, f"conversation {n}")
        assert read_sse(api, conversation)[-1].data["status"] == "completed"
        conversations.append(conversation)
    *held, idle = conversations
    # The ten oldest cannot be deleted now: a run of the first is running, one of each
    # of the nine others queued behind it (a whole batch of retention's).
    hang = Hang(text="still ", then=Text("going"))
    model.script(hang)
    chat(api, "busy", held[0])
    hang.wait_started(20)
    for conversation in held[1:]:
        chat(api, "queued", conversation)
    for conversation in held:
        _age(sophos_env, conversation, 20)
    _age(sophos_env, idle, 10)

    wait_for(lambda: idle in _expiring(worker), 30, interval=0.2, message="the idle one expiring")
    assert not any(conversation in _expiring(worker) for conversation in held)
    hang.release()
    wait_for(lambda: _status(api, idle) == 404, 60, interval=0.2, message="the idle conversation deleted")
    # Each held one's run ended: no longer idle, and kept.
    for conversation in held:
        assert read_sse(api, conversation)[-1].data["status"] == "completed"
        assert _status(api, conversation) == 200
