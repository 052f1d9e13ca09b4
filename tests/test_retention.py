"""``CONVERSATION_RETENTION_DAYS``: the live worker deletes conversations idle longer than that.

Real worker, API, Redis and SQLite. "Idle for ten days" is written into the
conversation's ``updated_at`` beside the worker (what a month of waiting would leave).
"""

from __future__ import annotations

import sqlite3

import redis as redis_sync

from shared.redis.keys import ACTIVE_RUNS
from tests.fakes.ollama import FakeOllama, Hang, Text
from tests.support.client import get_json, read_sse, wait_for
from tests.support.env import SophosEnv
from tests.support.http import http_client
from tests.support.procs import ServiceProcess
from tests.test_delete import chat, thread_rows
from tests.test_operators import metrics


def _age(env: SophosEnv, conversation: str, days: int) -> None:
    with sqlite3.connect(env.database_path, timeout=10) as db:
        db.execute(
            "UPDATE conversations SET updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?) WHERE id = ?",
            (f"-{days} days", conversation),
        )


def _status(api: str, conversation: str) -> int:
    with http_client(base_url=api, timeout=10) as http:
        return http.get(f"/api/conversations/{conversation}").status_code


def test_only_conversations_idle_past_the_retention_are_deleted(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    worker = start_worker(sophos_env.with_(CONVERSATION_RETENTION_DAYS=1))
    api = start_api(sophos_env).url
    model.script(Text("old"), Text("recent"))
    idle, _ = chat(api, "an old conversation")
    recent, _ = chat(api, "a recent one")
    for conversation in (idle, recent):
        assert read_sse(api, conversation)[-1].data["status"] == "completed"
    hang = Hang(text="still ", then=Text("going"))
    model.script(Text("first"), hang)
    busy, _ = chat(api, "old, but busy")
    assert read_sse(api, busy)[-1].data["status"] == "completed"
    chat(api, "and now?", busy)
    hang.wait_started(20)

    _age(sophos_env, idle, 10)
    _age(sophos_env, busy, 10)  # idle as the row says, but a run of it is running
    # Its delete is queued at once; the worker takes it between runs, once this one ends.
    wait_for(lambda: f'"conversation_id": "{idle}"' in _expiring(worker), 30, message="the idle one expiring")
    assert busy not in _expiring(worker) and recent not in _expiring(worker)
    hang.release()
    assert read_sse(api, busy)[-1].data["status"] == "completed"
    wait_for(lambda: _status(api, idle) == 404, 30, message="the idle conversation deleted")
    assert thread_rows(sophos_env.database_path, idle) == {
        "checkpoints": 0, "writes": 0, "runs": 0, "conversations": 0,
    }
    assert metrics(api)[("sophos_conversations_expired_total", ())] == 1
    assert '"reason": "retention"' in worker.log_text()
    # The busy one's run ended: no longer idle, and kept; so is the recent one.
    assert _status(api, recent) == 200
    assert get_json(api, f"/api/conversations/{busy}")["conversation"]["messageCount"] == 4
    assert busy not in _expiring(worker)


def _expiring(worker: ServiceProcess) -> str:
    return "\n".join(line for line in worker.log_text().splitlines() if "conversation.expiring" in line)


def test_without_a_retention_nothing_is_deleted(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    start_worker(sophos_env)
    api = start_api(sophos_env).url
    model.script(Text("kept"), Text("marker"))
    old, _ = chat(api, "an old conversation")
    assert read_sse(api, old)[-1].data["status"] == "completed"
    _age(sophos_env, old, 3650)
    # Wait for the sweep's passes instead of a time: it frees a claim whose run never started,
    # and a pass runs its extra tasks (retention among them, if set) before the next begins;
    # a planted claim freed twice over means one whole pass ran after the ageing.
    client = redis_sync.Redis.from_url(sophos_env.redis_url)
    for fake in ("00000000-0000-4000-8000-00000000000a", "00000000-0000-4000-8000-00000000000b"):
        client.hset(ACTIVE_RUNS, fake, fake)
        wait_for(lambda fake=fake: not client.hexists(ACTIVE_RUNS, fake), 30, message="a sweep pass")
    client.close()
    assert _status(api, old) == 200
    assert metrics(api)[("sophos_conversations_expired_total", ())] == 0
