"""Operators: list, page and cancel runs, watch the worker's pulse, scrape metrics, use the CLI.

Real worker, API, Redis and SQLite; the model is the fake Ollama, whose ``Hang``
reply holds a run in its first step so that a queue builds up behind it.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from shared.redis.keys import cancel_key
from tests.fakes.ollama import FakeOllama, Hang, Text, ToolCalls
from tests.support.client import (
    chat,
    get_json,
    read_sse,
    read_sse_async,
    tool_calls,
    wait_for,
    wait_for_async,
)
from tests.support.env import SophosEnv
from tests.support.http import http_client
from tests.support.metrics import Scrape, fetch, parse

RUNNING_TIMEOUT = 20.0


def runs(api_url: str, **params: Any) -> dict[str, Any]:
    listing: dict[str, Any] = get_json(api_url, "/api/runs", **params)
    return listing


def ids(listing: dict[str, Any]) -> list[str]:
    return [r["id"] for r in listing["runs"]]


def cancel(api_url: str, run_id: str, token: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with http_client(base_url=api_url, timeout=10) as http:
        return http.post(f"/api/runs/{run_id}/cancel", headers=headers)


def status_of(api_url: str, run_id: str) -> str:
    return str(get_json(api_url, f"/api/runs/{run_id}")["status"])


def wait_status(api_url: str, run_id: str, status: str, timeout: float = RUNNING_TIMEOUT) -> dict[str, Any]:
    info: dict[str, Any] = wait_for(
        lambda: (r := get_json(api_url, f"/api/runs/{run_id}"))["status"] == status and r,
        timeout=timeout, message=lambda: f"run {run_id} {status} (is {status_of(api_url, run_id)})",
    )
    return info


def metrics(api_url: str, token: str | None = None) -> Scrape:
    """Every sample of ``/metrics`` (tests/support/metrics.py), scraped as text/plain."""
    response = fetch(api_url, token)
    assert response.headers["content-type"].startswith("text/plain")
    return parse(response.text)


def worker_check(env: SophosEnv) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker", "--check"], env=env, capture_output=True, text=True, timeout=30
    )


def cli(env: SophosEnv, *args: str, extra_env: dict[str, str] | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sophos_cli", *args], env={**env, **(extra_env or {})},
        capture_output=True, text=True, timeout=timeout,
    )


def test_listing_and_paging_follow_a_queue_of_five_behind_a_slow_run(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    slow = Hang(text="thinking ")
    model.script(slow)
    worker = start_worker(sophos_env)
    api = start_api(sophos_env).url
    first_conversation, first = chat(api, "the slow one")
    slow.wait_started()
    running = wait_for(lambda: (r := runs(api, status="running")["runs"]) and r[0].get("node") and r[0])
    assert running["id"] == first and running["node"] == "agent" and running["stepCount"] == 1
    assert running["startedAt"] and running["durationMs"] is None

    queued: list[str] = []
    conversations: list[str] = []
    last_elapsed = running["elapsedMs"]
    for i in range(5):
        conversation, run = chat(api, f"queued {i}")
        queued.append(run)
        conversations.append(conversation)
        listing = runs(api)
        # Newest first: the queue in reverse, then the slow run.
        assert ids(listing) == [*reversed(queued), first]
        by_id = {r["id"]: r for r in listing["runs"]}
        assert [by_id[r]["position"] for r in queued] == list(range(len(queued)))
        assert all(by_id[r]["status"] == "queued" and by_id[r]["startedAt"] is None for r in queued)
        waited = [by_id[r]["waitedMs"] for r in queued]
        assert waited == sorted(waited, reverse=True), waited  # the first queued has waited longest
        slow_run = by_id[first]
        assert slow_run["status"] == "running" and slow_run["node"] == "agent"
        assert slow_run["elapsedMs"] >= last_elapsed
        last_elapsed = slow_run["elapsedMs"]
        assert listing["worker"]["alive"] is True and listing["worker"]["pid"] == worker.pid
        assert listing["worker"]["concurrency"] == 1

    # Filters.
    assert ids(runs(api, status="queued")) == list(reversed(queued))
    assert ids(runs(api, status="running")) == [first]
    assert ids(runs(api, status="completed")) == []
    assert ids(runs(api, conversation=conversations[2])) == [queued[2]]
    assert ids(runs(api, conversation=first_conversation)) == [first]
    assert ids(runs(api, status="queued", conversation=first_conversation)) == []
    one = get_json(api, f"/api/runs/{queued[3]}")
    assert one["status"] == "queued" and one["position"] == 3 and one["waitedMs"] >= 0

    # Paging: pages of two, joined, are the whole listing; the cursor is stable
    # while new runs arrive (they are newer than any page already read).
    everything = ids(runs(api))
    page = runs(api, limit=2)
    pages = [ids(page)]
    _, late = chat(api, "arrives while paging")
    while "nextCursor" in page:
        page = runs(api, limit=2, cursor=page["nextCursor"])
        pages.append(ids(page))
    assert [len(p) for p in pages] == [2, 2, 2]
    assert [run for p in pages for run in p] == everything
    assert ids(runs(api, limit=1)) == [late]

    # A rename queued among the runs is no run ahead of the ones behind it.
    with http_client(base_url=api, timeout=30) as http:
        renamed = http.patch(f"/api/conversations/{first_conversation}", json={"title": "the slow one"})
    assert renamed.status_code == 202, renamed.text  # queued: the worker is busy with the slow run
    _, behind = chat(api, "behind the rename")
    assert get_json(api, f"/api/runs/{behind}")["position"] == len(queued) + 1  # and `late`
    assert [r["position"] for r in runs(api, status="queued")["runs"]] == list(range(len(queued) + 2))[::-1]

    bad = get_json(api, "/api/runs", cursor="not-a-cursor", expect=400)
    assert bad["error"]["code"] == "BAD_REQUEST" and "cursor" in bad["error"]["message"]
    bad = get_json(api, "/api/runs", status="sleeping", expect=400)
    assert bad["error"]["code"] == "BAD_REQUEST"

    # The slow run ends; the queue drains in order; finished runs show duration and steps.
    slow.release()
    for run in [first, *queued, late, behind]:
        wait_status(api, run, "completed")
    done = runs(api, status="completed")
    assert ids(done) == [behind, late, *reversed(queued), first]
    for run in done["runs"]:
        assert run["durationMs"] >= 0 and run["stepCount"] == 1 and "error" not in run and "node" not in run
        assert run["startedAt"] >= run["enqueuedAt"] and run["finishedAt"] >= run["startedAt"]
    starts = [r["startedAt"] for r in reversed(done["runs"])]
    assert starts == sorted(starts)  # taken in queue order
    assert runs(api, status="queued")["runs"] == [] and runs(api, status="running")["runs"] == []


async def test_cancel_queued_running_twice_and_finished(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    slow = Hang(then=ToolCalls([("tools__add", {"a": 1, "b": 2})]))
    model.script(slow)
    start_worker(sophos_env)
    api = start_api(sophos_env).url
    conv_a, run_a = chat(api, "slow, then a tool")
    await slow.wait_started_async()
    conv_b, run_b = chat(api, "cancel me while I wait")
    _, run_c = chat(api, "keep my place")
    assert [r["position"] for r in runs(api, status="queued")["runs"]] == [1, 0]

    # A client watching the queued run: its stream must end with end/cancelled.
    watcher = asyncio.create_task(read_sse_async(api, conv_b, timeout=RUNNING_TIMEOUT))
    await wait_for_async(
        lambda: metrics(api).get(("sophos_sse_subscribers", ())) == 1, message="the watcher connected"
    )

    # Queued: removed from the queue at once, never started; twice is harmless.
    first = cancel(api, run_b)
    assert first.status_code == 200, first.text
    assert first.json()["status"] == "cancelled" and first.json()["startedAt"] is None
    again = cancel(api, run_b)
    assert again.status_code == 200 and again.json()["status"] == "cancelled"
    events = await watcher
    assert events[-1].event == "end"
    assert events[-1].data == {"conversation": conv_b, "run": run_b, "status": "cancelled"}
    queue = runs(api, status="queued")["runs"]
    assert [(r["id"], r["position"]) for r in queue] == [(run_c, 0)]
    assert ids(runs(api, status="cancelled")) == [run_b]
    assert run_b in ids(runs(api))
    info = get_json(api, f"/api/runs/{run_b}")
    assert info["status"] == "cancelled" and info["finishedAt"] and info["waitedMs"] >= 0
    # Nothing of it reached the database: its conversation (it was the first run) never existed.
    get_json(api, f"/api/conversations/{conv_b}", expect=404)

    # Running: the worker cuts it at once, in the middle of the model's answer
    # (tests/test_cancel.py has the details of a cut).
    asked = cancel(api, run_a)
    assert asked.status_code == 202, asked.text
    assert asked.json()["status"] == "running" and asked.json()["cancelRequested"] is True
    stream = read_sse(api, conv_a, timeout=RUNNING_TIMEOUT)
    assert stream[-1].event == "end"
    assert stream[-1].data == {"conversation": conv_a, "run": run_a, "status": "cancelled"}
    assert [e.data["event"] for e in stream.of("trace") if e.data["event"] != "message"] == ["enter", "leave"]
    slow.wait_client_gone()  # the model's answer was abandoned: its tool call never comes
    info = get_json(api, f"/api/runs/{run_a}")
    assert info["status"] == "cancelled" and info["stepCount"] == 1 and info["durationMs"] >= 0
    assert "error" not in info
    assert tool_calls(sophos_env.tools_log) == []
    detail = get_json(api, f"/api/conversations/{conv_a}")
    assert detail["conversation"]["status"] == "cancelled"
    assert detail["resumable"] is False  # the step that was cut is not resumed
    again = cancel(api, run_a)
    assert again.status_code == 200 and again.json()["status"] == "cancelled"

    # The run queued behind them runs; once finished it cannot be cancelled.
    wait_status(api, run_c, "completed")
    finished = cancel(api, run_c)
    assert finished.status_code == 409
    assert finished.json()["error"]["code"] == "RUN_FINISHED" and run_c in finished.json()["error"]["message"]

    # The cancelled conversation takes the next message; nothing of the cut step runs.
    model.script(Text("It is 3."))
    _, following = chat(api, "what is 1 + 2?", conv_a)
    stream = read_sse(api, conv_a, timeout=RUNNING_TIMEOUT)
    assert stream[-1].data["run"] == following and stream[-1].data["status"] == "completed"
    assert stream.text == "It is 3."
    assert tool_calls(sophos_env.tools_log) == []
    assert model.calls == 3  # a, c and a's next message: b never reached the model

    missing = cancel(api, "00000000-0000-4000-8000-000000000000")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "NOT_FOUND"
    bad = cancel(api, "../etc")
    assert bad.status_code in (400, 404) and "error" in bad.json()


def test_a_late_client_sees_the_cancelled_queued_run_not_the_one_before(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    model.script(Text("First answer."))
    start_worker(sophos_env)
    # The API publishes the cancelled run's ending: a short EVENT_RETENTION lets its stream expire.
    api = start_api(sophos_env.with_(EVENT_RETENTION=2)).url
    conversation, first = chat(api, "first")
    wait_status(api, first, "completed")

    # Keep the worker busy elsewhere, so the next run of the conversation stays queued.
    slow = Hang(text="busy ")
    model.script(slow)
    _, busy = chat(api, "hold the worker")
    slow.wait_started()
    _, queued = chat(api, "never runs", conversation=conversation)
    assert status_of(api, queued) == "queued"
    assert cancel(api, queued).status_code == 200

    # Connected only now: the conversation's current run is the cancelled one, not the first.
    stream = read_sse(api, conversation, timeout=RUNNING_TIMEOUT)
    assert stream[-1].event == "end"
    assert stream[-1].data == {"conversation": conversation, "run": queued, "status": "cancelled"}
    assert not stream.of("token")  # nothing of the first run's answer
    # Once its stream has expired, the ending is rebuilt from its Redis record (it has no row).
    expired = wait_for(
        lambda: (e := read_sse(api, conversation, timeout=RUNNING_TIMEOUT))[0].event == "missed" and e,
        timeout=RUNNING_TIMEOUT, interval=0.5, message="the cancelled run's stream expired",
    )
    assert [e.event for e in expired] == ["missed", "end"]
    assert expired[-1].data == {"conversation": conversation, "run": queued, "status": "cancelled"}

    # A run accepted after the cancel is the current one again.
    model.script(Text("Second answer."))
    slow.release()
    wait_status(api, busy, "completed")
    _, later = chat(api, "runs", conversation=conversation)
    wait_status(api, later, "completed")
    stream = read_sse(api, conversation, timeout=RUNNING_TIMEOUT)
    assert stream[-1].data == {"conversation": conversation, "run": later, "status": "completed"}
    assert stream.text == "Second answer."


@pytest.mark.fault
async def test_cancelled_running_run_whose_worker_dies_is_recorded_cancelled(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama, redis: Redis
) -> None:
    slow = Hang(then=Text("too late"))
    model.script(slow)
    worker = start_worker(sophos_env)
    api = start_api(sophos_env).url
    try:
        conv, run = chat(api, "cancel me, then die")
        await slow.wait_started_async()
        # Stopped first, so it dies before it hears the cancel (it would cut the run at once).
        worker.signal(signal.SIGSTOP)
        asked = cancel(api, run)
        assert asked.status_code == 202, asked.text
        worker.kill()
        assert worker.wait(10) == -signal.SIGKILL
    finally:
        slow.release()

    start_worker(sophos_env)
    info = get_json(api, f"/api/runs/{run}")
    assert info["status"] == "cancelled" and "error" not in info
    stream = read_sse(api, conv, timeout=RUNNING_TIMEOUT)
    assert stream[-1].event == "end"
    assert stream[-1].data == {"conversation": conv, "run": run, "status": "cancelled"}
    assert await redis.exists(cancel_key(run)) == 0
    detail = get_json(api, f"/api/conversations/{conv}")
    assert detail["conversation"]["status"] == "cancelled"
    assert detail["resumable"] is True  # the model step in flight is still to run

    model.script(Text("Done now."))
    _, resumed = chat(api, conversation=conv, resume=True)
    stream = read_sse(api, conv, timeout=RUNNING_TIMEOUT)
    assert stream[-1].event == "end"
    assert stream[-1].data == {"conversation": conv, "run": resumed, "status": "completed"}
    assert stream.text == "Done now."


@pytest.mark.fault
def test_dead_worker_shows_in_readyz_runs_metrics_and_check(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    worker = start_worker(sophos_env)
    api = start_api(sophos_env).url
    ready = wait_for(lambda: get_json(api, "/api/readyz", expect=200), timeout=RUNNING_TIMEOUT)
    assert ready["worker"]["alive"] is True and ready["worker"]["pid"] == worker.pid
    assert ready["worker"]["startedAt"] <= ready["worker"]["lastBeatAt"]
    alive = worker_check(sophos_env)
    assert alive.returncode == 0, alive.stderr
    assert alive.stdout.startswith("worker alive") and f"pid {worker.pid}" in alive.stdout
    assert runs(api)["worker"]["alive"] is True
    assert metrics(api)[("sophos_worker_up", ())] == 1

    worker.kill()
    killed_at = time.monotonic()
    assert worker.wait(10) == -signal.SIGKILL
    body = wait_for(
        lambda: (
            (r := httpx.get(f"{api}/api/readyz", timeout=5, trust_env=False)).status_code == 503 and r.json()
        ),
        timeout=20, interval=0.2, message="readyz 503",
    )
    noticed = time.monotonic() - killed_at
    assert body["error"]["code"] == "NOT_READY" and body["checks"]["worker"] is False
    assert body["checks"]["redis"] is True and "worker" in body["error"]["message"]
    assert body["worker"]["alive"] is False and body["worker"]["startedAt"] == ready["worker"]["startedAt"]
    assert noticed < 15, noticed  # a few heartbeats (2 s apart, 10 s expiry)

    dead = worker_check(sophos_env)
    assert dead.returncode == 1 and "no live worker" in dead.stderr and str(worker.pid) in dead.stderr
    info = runs(api)["worker"]
    # Told by the beating connection Redis dropped at the kill, before the heartbeat expired
    # (10 s after its last beat): the age is the last beat's, however recent.
    assert info["alive"] is False and info["pid"] == worker.pid and info["heartbeatAgeMs"] < 10_000
    samples = metrics(api)
    assert samples[("sophos_worker_up", ())] == 0
    assert 0 <= samples[("sophos_worker_heartbeat_age_seconds", ())] < 10

    unreachable = subprocess.run(
        [sys.executable, "-m", "worker", "--check"], env={**sophos_env, "REDIS_URL": "redis://127.0.0.1:1/0"},
        capture_output=True, text=True, timeout=30,
    )
    assert unreachable.returncode == 2 and "cannot reach Redis" in unreachable.stderr


async def test_metrics_parse_and_match_the_runs_listing(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    slow = Hang(text="hm")
    model.script(ToolCalls([("tools__add", {"a": 2, "b": 2})]), Text("Four."), slow)
    start_worker(sophos_env)
    api = start_api(sophos_env).url
    _, run_1 = chat(api, "add two and two")
    wait_status(api, run_1, "completed")
    conv_2, _ = chat(api, "think slowly")
    await slow.wait_started_async()
    _, run_3 = chat(api, "wait")
    _, run_4 = chat(api, "wait, then go away")
    assert cancel(api, run_4).status_code == 200
    watcher = asyncio.create_task(read_sse_async(api, conv_2, timeout=RUNNING_TIMEOUT))
    await wait_for_async(lambda: metrics(api).get(("sophos_sse_subscribers", ())) == 1)

    listing = runs(api)
    samples = metrics(api)
    by_status: dict[str, int] = {}
    for run in listing["runs"]:
        by_status[run["status"]] = by_status.get(run["status"], 0) + 1
    assert by_status == {"completed": 1, "running": 1, "queued": 1, "cancelled": 1}
    assert samples[("sophos_runs_queued", ())] == by_status["queued"]
    assert samples[("sophos_runs_running", ())] == by_status["running"]
    for status in ("completed", "failed", "interrupted", "cancelled"):
        assert samples[("sophos_runs_finished_total", (("status", status),))] == by_status.get(status, 0)
    oldest = max(r["waitedMs"] for r in listing["runs"] if r["status"] == "queued") / 1000
    assert oldest <= samples[("sophos_queue_oldest_age_seconds", ())] < oldest + 5
    assert samples[("sophos_redis_up", ())] == 1 and samples[("sophos_database_up", ())] == 1
    assert samples[("sophos_worker_up", ())] == 1
    assert 0 <= samples[("sophos_worker_heartbeat_age_seconds", ())] < 10
    # Worker-side figures: run 1 made two model calls and one tool call; run 2's call is in flight.
    assert samples[("sophos_model_call_duration_seconds_count", ())] == 2
    assert samples[("sophos_model_call_duration_seconds_bucket", (("le", "+Inf"),))] == 2
    assert samples[("sophos_tool_call_duration_seconds_count", (("tool", "tools__add"),))] == 1
    completed = (("status", "completed"),)
    assert samples[("sophos_run_duration_seconds_count", completed)] == 1
    duration = get_json(api, f"/api/runs/{run_1}")["durationMs"] / 1000
    # The worker times from before its first write to after its last; the row, between them.
    assert duration - 0.002 <= samples[("sophos_run_duration_seconds_sum", completed)] < duration + 1

    slow.release()
    await watcher
    wait_status(api, run_3, "completed")
    samples = metrics(api)
    assert samples[("sophos_runs_finished_total", (("status", "completed"),))] == 3
    assert samples[("sophos_runs_queued", ())] == 0 and samples[("sophos_runs_running", ())] == 0
    assert samples[("sophos_queue_oldest_age_seconds", ())] == 0
    assert samples[("sophos_model_call_duration_seconds_count", ())] == model.calls == 4
    assert samples[("sophos_run_duration_seconds_count", completed)] == 3
    assert samples[("sophos_sse_subscribers", ())] == 0


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def histogram(samples: Samples, name: str, **labels: str) -> tuple[float, float]:
    """A histogram's (count, sum), once its buckets are checked: cumulative, ending at the count."""
    labs = tuple(sorted(labels.items()))
    buckets = sorted(
        (float(dict(key)["le"]), value) for (sample, key), value in samples.items()
        if sample == f"{name}_bucket" and tuple(kv for kv in key if kv[0] != "le") == labs
    )
    assert buckets and buckets[-1][0] == float("inf"), name
    counts = [value for _, value in buckets]
    assert counts == sorted(counts), f"{name}: buckets not cumulative {buckets}"
    count, total = samples[(f"{name}_count", labs)], samples[(f"{name}_sum", labs)]
    assert counts[-1] == count and total >= 0, name
    return count, total


@pytest.mark.backends
def test_a_runs_time_is_told_in_histograms_and_in_its_breakdown(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    # The model thinks for a while (held by the test), then calls a tool that takes 0.5 s.
    thinking = Hang(text="let me see ", then=ToolCalls([("tools__slow", {"seconds": 0.5})]))
    model.script(thinking, Text("Done."))
    start_worker(sophos_env)
    api = start_api(sophos_env).url
    _, run = chat(api, "take your time")
    thinking.wait_started()
    time.sleep(0.4)
    thinking.release()
    info = wait_status(api, run, "completed")
    # The outcome is committed before its metrics reach Redis (persist, then notify).
    completed = ("sophos_run_duration_seconds_count", (("status", "completed"),))
    samples = wait_for(lambda: (s := metrics(api)).get(completed) == 1 and s, message="the run's duration")

    assert histogram(samples, "sophos_run_duration_seconds", status="completed")[0] == 1
    assert histogram(samples, "sophos_queue_wait_seconds")[0] == 1
    count, first_token = histogram(samples, "sophos_time_to_first_token_seconds")
    assert count == 1 and 0 < first_token < info["durationMs"] / 1000
    count, model_seconds = histogram(samples, "sophos_model_call_duration_seconds")
    assert count == 2 and model_seconds >= 0.4
    count, tool_seconds = histogram(samples, "sophos_tool_call_duration_seconds", tool="tools__slow")
    assert count == 1 and tool_seconds >= 0.5
    # Each step's checkpoint (input, agent, tools, agent) and each task's writes.
    writes, write_seconds = histogram(samples, "sophos_checkpoint_write_duration_seconds")
    assert writes >= 4 and write_seconds > 0

    parts = info["breakdown"]
    assert parts["queuedMs"] == info["waitedMs"] >= 0
    assert 400 <= parts["modelMs"] <= model_seconds * 1000 + 1
    assert 500 <= parts["toolsMs"] <= tool_seconds * 1000 + 1
    assert 0 <= parts["databaseMs"] <= write_seconds * 1000 + 1
    assert parts["modelMs"] + parts["toolsMs"] + parts["databaseMs"] <= info["durationMs"]
    assert get_json(api, "/api/runs", status="completed")["runs"][0]["breakdown"] == parts


def test_cli_streams_a_run_lists_runs_cancels_and_resumes(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    env = sophos_env.with_(API_TOKEN="operator-secret")
    model.script(ToolCalls([("tools__add", {"a": 2, "b": 3})]), Text("The sum is 5."))
    start_worker(env)
    api = start_api(env).url
    as_operator = {"SOPHOS_TOKEN": "operator-secret"}

    done = cli(env, "chat", "add 2 and 3", "--url", api, extra_env=as_operator)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == '[tool] tools__add({"a": 2, "b": 3})'
    assert lines[1] == "[tool] tools__add -> 5"
    assert lines[-1] == "The sum is 5."
    conversation = done.stderr.split()[1]
    assert get_json(api, f"/api/conversations/{conversation}", token="operator-secret")["messages"]

    refused = cli(env.with_(API_TOKEN=None), "runs", "--url", api)  # API_TOKEN is read as a token too
    assert refused.returncode == 1 and "UNAUTHORIZED" in refused.stderr

    # A run held in its first step, one queued behind it: the table shows both.
    slow = Hang(text="Let me see", then=ToolCalls([("tools__add", {"a": 1, "b": 1})]))
    model.script(slow)
    watcher = subprocess.Popen(
        [sys.executable, "-m", "sophos_cli", "chat", "slow", "--url", api],
        env={**env, **as_operator}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        slow.wait_started(timeout=RUNNING_TIMEOUT)
        _, queued = chat_with_token(api, "behind it")
        table = cli(env, "runs", "--url", api, "--token", "operator-secret")
        assert table.returncode == 0, table.stderr
        rows = table.stdout.splitlines()
        assert rows[0].startswith("worker: alive")
        header = ["STATUS", "RUN", "CONVERSATION", "POS/NODE/ERROR", "STEPS", "WAITED", "TIME"]
        assert rows[1].split() == header
        running_row, queued_row = rows[2].split(), rows[3].split()
        assert running_row[0] == "running" and running_row[3] == "agent" and running_row[4] == "1"
        # The API says position 0 (no run ahead); the table counts from 1, as chat does.
        assert queued_row[0] == "queued" and queued_row[1] == queued and queued_row[3] == "#1"
        slow_run = running_row[1]

        asked = cli(env, "cancel", slow_run, "--url", api, extra_env=as_operator)
        assert asked.returncode == 0 and slow_run in asked.stdout
        out, err = watcher.communicate(timeout=RUNNING_TIMEOUT)
    finally:
        slow.release()
        if watcher.poll() is None:
            watcher.kill()
            watcher.communicate()
    # Cut in the middle of the model's answer: its tool call never came.
    assert watcher.returncode == 1 and "the run was cancelled" in err
    assert out.startswith("Let me see") and "[tool]" not in out
    slow_conversation = err.split()[1]

    wait_status_token(api, queued, "completed")
    extra = {**as_operator, "SOPHOS_URL": api}
    refused = cli(env, "chat", "--resume", "--conversation", slow_conversation, "--url", api, extra_env=extra)
    assert refused.returncode == 1 and "RUN_NOT_RESUMABLE" in refused.stderr  # a cut is not resumed
    following = cli(env, "chat", "go on", "--conversation", slow_conversation, "--url", api, extra_env=extra)
    assert following.returncode == 0, following.stderr
    assert following.stdout.splitlines()[-1] == "ok"
    cancelled = ("sophos_runs_finished_total", (("status", "cancelled"),))
    assert metrics(api, token="operator-secret")[cancelled] == 1
    with http_client(base_url=api) as http:
        assert http.get("/metrics").status_code == 401

    nothing = cli(env, "chat", "--resume", "--url", api, extra_env=as_operator)
    assert nothing.returncode == 2 and "--resume needs --conversation" in nothing.stderr
    down = cli(env, "runs", "--url", "http://127.0.0.1:9", extra_env=as_operator)
    assert down.returncode == 3 and "cannot reach the API" in down.stderr


def chat_with_token(api_url: str, message: str) -> tuple[str, str]:
    return chat(api_url, message, token="operator-secret")


def wait_status_token(api_url: str, run_id: str, status: str) -> None:
    wait_for(
        lambda: get_json(api_url, f"/api/runs/{run_id}", token="operator-secret")["status"] == status,
        timeout=RUNNING_TIMEOUT, message=f"run {run_id} {status}",
    )



async def test_a_run_out_of_the_queue_and_not_yet_recorded_is_first_in_line_not_unknown(
    sophos_env: SophosEnv, start_api, redis: Redis
) -> None:
    """Between a worker taking a job (arq removes it from the queue) and recording its run, the
    run has no row and no queue entry: it is shown queued at position 0, not 404."""
    from shared.redis.keys import QUEUE_NAME

    api = start_api(sophos_env).url  # no worker: the run stays where the test puts it
    _, run = chat(api, "taken")
    assert status_of(api, run) == "queued"
    assert await redis.zrem(QUEUE_NAME, run) == 1  # as arq does when a worker takes the job
    info = get_json(api, f"/api/runs/{run}")
    assert (info["status"], info["position"]) == ("queued", 0)
