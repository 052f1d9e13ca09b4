"""Webhooks of Agent Protocol runs (docs/agent-protocol.md, "Webhooks"), driven by the real
``langgraph-sdk`` client against a real API and worker with the fake model, and received by a
loopback HTTP server of the test's own (loopback over plain http is allowed by settings here,
except where the default policy's refusals are tested).

The tests that neither restart nor reconfigure the worker share one worker and API, on a Redis of
their own (tests/support/stacks.py); the others start their own."""

from __future__ import annotations

import json
import signal
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient
from redis.asyncio import Redis

from shared.contracts.webhooks import enqueue_delivery, webhook_job_id
from shared.redis.keys import QUEUE_NAME, arq_job_key, protocol_run_key
from tests.fakes.ollama import FakeOllama, Hang, Text
from tests.support.agent_protocol import said
from tests.support.client import wait_for_async
from tests.support.env import SophosEnv
from tests.support.stacks import Stack, own_redis_stack

#: loopback over plain http, retried quickly: what these tests need of the policy and the backoff
ALLOWED = {
    "WEBHOOK_ALLOW_HTTP": "1", "WEBHOOK_ALLOW_PRIVATE": "1", "WEBHOOK_RETRY_SECONDS": "0.2",
    "WEBHOOK_TIMEOUT": "60",
}


class Receiver:
    """Records every POST by path; answers a path's scripted statuses in turn (then 200); a
    path in ``hanging`` holds its request until :meth:`release`."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.posts: dict[str, list[dict[str, Any]]] = {}
        self.statuses: dict[str, list[int]] = {}
        self.hanging: set[str] = set()
        #: paths whose first request only is held
        self.hang_first: set[str] = set()
        self.released = threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def received(self, path: str) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.posts.get(path, []))

    def release(self) -> None:
        self.released.set()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                body["_received_at"] = time.monotonic()
                path = self.path
                with receiver.lock:
                    receiver.posts.setdefault(path, []).append(body)
                    scripted = receiver.statuses.get(path) or []
                    status = scripted.pop(0) if scripted else 200
                    first = len(receiver.posts[path]) == 1
                if path in receiver.hanging or (path in receiver.hang_first and first):
                    receiver.released.wait(60)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        return Handler


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    hooks = Receiver()
    thread = threading.Thread(target=hooks.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield hooks
    finally:
        hooks.release()
        hooks.server.shutdown()
        hooks.server.server_close()


@pytest.fixture
def allowed_env(sophos_env: SophosEnv) -> SophosEnv:
    return sophos_env.with_(**ALLOWED)


@pytest.fixture(scope="module")
def shared_stack(tmp_path_factory: pytest.TempPathFactory, fake_ollama: FakeOllama) -> Iterator[Stack]:
    """One worker and API (webhooks to loopback allowed) for the tests that neither restart nor
    reconfigure them; each test's threads and receiver are its own."""
    with own_redis_stack(tmp_path_factory.mktemp("webhooks"), fake_ollama, **ALLOWED) as stack:
        yield stack


@pytest.fixture
async def client(shared_stack: Stack) -> AsyncIterator[LangGraphClient]:
    async with get_client(url=shared_stack.api) as sdk:
        yield sdk


def a_path() -> str:
    return f"/hooks/{uuid.uuid4()}?token=s3cret"


async def received_one(receiver: Receiver, path: str) -> dict[str, Any]:
    posts = await wait_for_async(lambda: receiver.received(path), timeout=30, message=f"a POST on {path}")
    assert len(posts) == 1, posts
    return posts[0]


async def delivery(
    client: LangGraphClient, thread_id: str, run_id: str, *outcomes: str
) -> dict[str, Any]:
    """The run's webhook delivery, once its outcome is one of ``outcomes``."""
    async def reached() -> dict[str, Any] | None:
        webhook = dict(await client.runs.get(thread_id, run_id)).get("webhook")
        return webhook if isinstance(webhook, dict) and webhook["outcome"] in outcomes else None

    return await wait_for_async(reached, timeout=30, message=f"webhook of {run_id} {' or '.join(outcomes)}")


async def test_a_run_with_a_webhook_is_posted_once_when_it_ends(
    client: LangGraphClient, model: FakeOllama, receiver: Receiver, shared_stack: Stack
) -> None:
    model.script(Text("hello there"))
    path = a_path()
    thread_id = (await client.threads.create())["thread_id"]
    values = await client.runs.wait(thread_id, "agent", input=said("hi"), webhook=receiver.url(path))
    assert isinstance(values, dict)
    body = await received_one(receiver, path)
    run_id = body["run_id"]
    assert body["thread_id"] == thread_id and body["status"] == "success"
    assert [m["content"] for m in body["values"]["messages"]] == ["hi", "hello there"]
    assert body["assistant_id"] and body["webhook_sent_at"]
    run = dict(await client.runs.get(thread_id, run_id))
    assert {k: body[k] for k in ("run_id", "status", "created_at", "metadata")} == {
        k: run[k] for k in ("run_id", "status", "created_at", "metadata")
    }
    recorded = await delivery(client, thread_id, run_id, "delivered")
    assert recorded["attempts"] == 1 and recorded["last_status"] == "200" and recorded["delivered_at"]
    assert "token" not in recorded["url"] and recorded["url"].endswith(path.split("?")[0])
    assert len(receiver.received(path)) == 1
    # The worker logged the delivery, and no process logged the URL's query (it may hold a secret).
    logs = {proc.name: proc.log_path.read_text() for proc in shared_stack.group.processes}
    assert any("webhook.delivered" in text for text in logs.values()), logs
    assert not [name for name, text in logs.items() if "s3cret" in text]


async def test_a_failing_receiver_gets_it_on_the_third_attempt(
    client: LangGraphClient, model: FakeOllama, receiver: Receiver
) -> None:
    path = a_path()
    receiver.statuses[path] = [500, 503]
    thread_id = (await client.threads.create())["thread_id"]
    run = await client.runs.create(thread_id, "agent", input=said("hi"), webhook=receiver.url(path))
    recorded = await delivery(client, thread_id, run["run_id"], "delivered", "failed")
    assert (recorded["outcome"], recorded["attempts"], recorded["last_status"]) == ("delivered", 3, "200")
    posts = receiver.received(path)
    assert len(posts) == 3 and {p["run_id"] for p in posts} == {run["run_id"]}
    assert {p["status"] for p in posts} == {"success"}
    # Backed off: WEBHOOK_RETRY_SECONDS (0.2) before the second attempt, twice that before the third.
    first, second, third = (p["_received_at"] for p in posts)
    assert second - first >= 0.2 and third - second >= 0.4, (second - first, third - second)


async def test_a_cancelled_run_says_interrupted(
    client: LangGraphClient, model: FakeOllama, receiver: Receiver
) -> None:
    hang = Hang(text="half an ")
    model.script(hang)
    path = a_path()
    thread_id = (await client.threads.create())["thread_id"]
    run = await client.runs.create(thread_id, "agent", input=said("go"), webhook=receiver.url(path))
    await hang.wait_started_async(20)
    # Another thread's run waits in the queue behind it (one run at a time): cancelled there.
    queued_path = a_path()
    other = (await client.threads.create())["thread_id"]
    queued = await client.runs.create(other, "agent", input=said("later"), webhook=receiver.url(queued_path))
    assert queued["status"] == "pending"
    await client.runs.cancel(other, queued["run_id"])
    await client.runs.cancel(thread_id, run["run_id"])
    body = await received_one(receiver, path)
    assert body["run_id"] == run["run_id"] and body["status"] == "interrupted"
    body = await received_one(receiver, queued_path)
    assert body["run_id"] == queued["run_id"] and body["status"] == "interrupted"
    assert body["values"] == {} and body["created_at"]


async def test_a_run_cut_by_a_crash_says_interrupted(
    allowed_env: SophosEnv, start_worker, start_api, model: FakeOllama, receiver: Receiver
) -> None:
    hang = Hang(text="half an ")
    model.script(hang)
    worker = start_worker(allowed_env)
    api = start_api(allowed_env)
    path = a_path()
    async with get_client(url=api.url) as client:
        thread_id = (await client.threads.create())["thread_id"]
        run = await client.runs.create(thread_id, "agent", input=said("go"), webhook=receiver.url(path))
        await hang.wait_started_async(20)
        worker.kill()
        assert worker.wait(10) == -signal.SIGKILL
        assert receiver.received(path) == []
        start_worker(allowed_env)  # finds the run orphaned: interrupted
        body = await received_one(receiver, path)
        assert body["run_id"] == run["run_id"] and body["status"] == "interrupted"
        assert body["error"]["error"] == "INTERRUPTED"


async def test_an_attempt_cut_by_the_workers_death_is_made_again(
    allowed_env: SophosEnv, start_worker, start_api, model: FakeOllama, receiver: Receiver
) -> None:
    # The restarted worker frees the dead one's jobs at once (SQLite: it is the only worker); on
    # PostgreSQL the attempt's marker would lapse WEBHOOK_TIMEOUT + 10 s after it began.
    env = allowed_env.with_(WEBHOOK_TIMEOUT=3)
    worker = start_worker(env)
    api = start_api(env)
    path = a_path()
    receiver.hang_first.add(path)
    async with get_client(url=api.url) as client:
        thread_id = (await client.threads.create())["thread_id"]
        run = await client.runs.create(thread_id, "agent", input=said("hi"), webhook=receiver.url(path))
        await received_one(receiver, path)  # the first attempt, held by the receiver
        worker.kill()
        assert worker.wait(10) == -signal.SIGKILL
        start_worker(env)
        recorded = await delivery(client, thread_id, run["run_id"], "delivered", "failed")
        assert (recorded["outcome"], recorded["attempts"]) == ("delivered", 2), recorded
        assert [p["run_id"] for p in receiver.received(path)] == [run["run_id"]] * 2


#: URLs the default policy refuses (https only, public addresses only), and the problem named
REFUSED = [
    ("http://127.0.0.1:9/hook", "must be https"),
    ("http://example.com/hook?token=s3cret", "must be https"),
    ("ftp://example.com/hook", "must be https"),
    ("https://127.0.0.1:9/hook", "loopback, private or link-local"),
    ("https://10.1.2.3/hook", "loopback, private or link-local"),
    ("https://169.254.169.254/latest/meta-data", "loopback, private or link-local"),
    ("https://[::1]/hook", "loopback, private or link-local"),
    ("https://localhost:9/hook?token=s3cret", "loopback, private or link-local"),
]


async def refusal(answer: Any) -> httpx.Response:
    """The refusal of a run's creation (runs.wait raises httpx's error, the others the SDK's, a
    subclass of it; runs.stream is refused when iterated)."""
    try:
        if hasattr(answer, "__aiter__"):
            [part async for part in answer]
        else:
            await answer
    except httpx.HTTPStatusError as exc:
        return exc.response
    raise AssertionError("the run was accepted")


async def test_a_refused_url_is_422_naming_the_problem_and_changes_nothing(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    start_worker(sophos_env)  # the defaults
    api = start_api(sophos_env)
    async with get_client(url=api.url) as client:
        thread_id = (await client.threads.create())["thread_id"]
        for url, problem in REFUSED:
            for create in (client.runs.create, client.runs.stream, client.runs.wait):
                response = await refusal(create(thread_id, "agent", input=said("hi"), webhook=url))
                assert response.status_code == 422
                error = response.json()["error"]
                assert error["code"] == "BAD_REQUEST", error
                assert error["message"].startswith("webhook: ") and problem in error["message"], (url, error)
                assert "s3cret" not in error["message"]
        assert await client.runs.list(thread_id) == []
        assert (await client.threads.get(thread_id))["status"] == "idle"


async def test_a_hanging_receiver_does_not_hold_the_run_or_its_events(
    client: LangGraphClient, model: FakeOllama, receiver: Receiver
) -> None:
    model.script(Text("quick answer"))
    path = a_path()
    receiver.hanging.add(path)
    thread_id = (await client.threads.create())["thread_id"]
    parts = [
        part async for part in client.runs.stream(
            thread_id, "agent", input=said("hi"), webhook=receiver.url(path), stream_mode=["values"]
        )
    ]
    assert parts[-1].event == "end" and parts[-1].data["status"] == "success", parts[-1]
    run_id = parts[0].data["run_id"]
    # The hook is called after the end, and is still held by the receiver: pending.
    body = await received_one(receiver, path)
    assert body["run_id"] == run_id and body["status"] == "success"
    recorded = await delivery(client, thread_id, run_id, "pending")
    assert recorded["attempts"] == 0
    assert (await client.runs.get(thread_id, run_id))["status"] == "success"
    receiver.release()
    recorded = await delivery(client, thread_id, run_id, "delivered")
    assert recorded["attempts"] == 1


async def test_the_delivery_is_enqueued_once_whoever_enqueues_it(redis: Redis) -> None:
    """The endings' ``hook_run`` and the API's late enqueueing (a run that ended before its record
    named the webhook) are one script: a run with no webhook enqueues nothing, and a second
    enqueueing (an ending retried, or the API after the ending) enqueues nothing more."""
    run_id, conversation_id = str(uuid.uuid4()), str(uuid.uuid4())
    job_id = webhook_job_id(run_id)
    await enqueue_delivery(redis, run_id, conversation_id)
    assert await redis.zcard(QUEUE_NAME) == 0 and not await redis.exists(protocol_run_key(run_id))
    await redis.hset(protocol_run_key(run_id), "webhook", "https://hooks.example.com/x")
    await enqueue_delivery(redis, run_id, conversation_id)
    assert await redis.zrange(QUEUE_NAME, 0, -1) == [job_id] and await redis.exists(arq_job_key(job_id))
    assert await redis.hget(protocol_run_key(run_id), "webhook_outcome") == "pending"
    await redis.delete(arq_job_key(job_id))  # taken and done
    await redis.zrem(QUEUE_NAME, job_id)
    await enqueue_delivery(redis, run_id, conversation_id)
    assert await redis.zcard(QUEUE_NAME) == 0 and not await redis.exists(arq_job_key(job_id))


async def test_a_webhook_after_a_rollback_carries_the_branch_the_thread_follows(
    client: LangGraphClient, model: FakeOllama, receiver: Receiver
) -> None:
    """After ``runs.cancel(action="rollback")`` the thread follows the branch the cancelled run
    started from (its newest checkpoints are the abandoned run's): a webhook sent then carries
    that branch's messages, not the abandoned ones."""
    thread_id = (await client.threads.create())["thread_id"]
    abandoned, busy = Hang(text="Working on it"), Hang(text="busy ")
    model.script(Text("First."), abandoned, busy)
    await client.runs.wait(thread_id, "agent", input=said("one"))
    run = await client.runs.create(thread_id, "agent", input=said("slowly"))
    await abandoned.wait_started_async(20)
    await client.runs.cancel(thread_id, run["run_id"], action="rollback")
    assert [m["content"] for m in (await client.threads.get_state(thread_id))["values"]["messages"]] == [
        "one", "First.",
    ]
    # A run with a webhook, cancelled while it waits in the queue behind another thread's run
    # (one run at a time): its webhook is sent with the thread as it stands.
    other = (await client.threads.create())["thread_id"]
    holding = await client.runs.create(other, "agent", input=said("hold the worker"))
    await busy.wait_started_async(20)
    path = a_path()
    queued = await client.runs.create(thread_id, "agent", input=said("later"), webhook=receiver.url(path))
    assert queued["status"] == "pending"
    await client.runs.cancel(thread_id, queued["run_id"])
    busy.release()
    await client.runs.join(other, holding["run_id"])
    body = await received_one(receiver, path)
    assert body["run_id"] == queued["run_id"] and body["status"] == "interrupted"
    assert [m["content"] for m in body["values"]["messages"]] == ["one", "First."]
