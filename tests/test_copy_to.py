"""``python -m worker --copy-to postgresql://…``: a SQLite deployment's data, brought to PostgreSQL.

Real processes: a worker on a SQLite file (one of them SIGKILLed mid-run), the copy as a
subprocess, then a worker and an API on the machine's PostgreSQL (a fresh database), where the
same conversations must list, export and resume as they did on SQLite.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from typing import Any

import httpx
import psycopg

from tests.fakes.ollama import FakeOllama, Hang, Text, ToolCalls
from tests.support.client import chat, get_json, read_sse, tool_calls, wait_for
from tests.support.env import SophosEnv
from tests.support.procs import ServiceProcess

SUMMARY = re.compile(
    r"copied (\d+) conversations, (\d+) runs, (\d+) threads"
    r" \((\d+) checkpoints, (\d+) writes\) to .+ in [\d.]+s"
)


def fork(api_url: str, path: str, body: dict[str, Any]) -> None:
    """An edit, a regenerate or a switch (``path``), accepted."""
    response = httpx.post(f"{api_url}{path}", json=body, timeout=30, trust_env=False)
    assert response.status_code == 202, response.text


def copy_to(env: SophosEnv, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker", "--copy-to", *args],
        env=env, cwd=env.root, capture_output=True, text=True, timeout=60, check=False,
    )


def listed(api_url: str) -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in get_json(api_url, "/api/conversations", limit=50)["conversations"]}


def status_of(api_url: str, conversation: str) -> str:
    return str(listed(api_url)[conversation]["status"])


def exports(api_url: str, conversation: str) -> tuple[str, str]:
    path = f"/api/conversations/{conversation}/export"
    return get_json(api_url, path, raw=True), get_json(api_url, path, raw=True, format="jsonl")


def snapshot(api_url: str) -> dict[str, Any]:
    """What the API shows: the listing, and each conversation's detail and both exports."""
    conversations = listed(api_url)
    return {
        "list": conversations,
        "detail": {c: get_json(api_url, f"/api/conversations/{c}") for c in conversations},
        "export": {c: exports(api_url, c) for c in conversations},
        "runs": {r["id"]: r for r in get_json(api_url, "/api/runs")["runs"]},
    }


def row_counts(url: str) -> dict[str, int]:
    counts = {}
    with psycopg.connect(url) as conn:
        for table in ("conversations", "runs", "checkpoints", "checkpoint_blobs", "checkpoint_writes"):
            row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()  # noqa: S608 - fixed names
            assert row is not None
            counts[table] = int(row[0])
    return counts


def kill_mid_run(worker: ServiceProcess, hang: Hang) -> None:
    hang.wait_started(20)
    worker.kill()
    assert worker.wait(10) == -signal.SIGKILL


def test_a_copied_database_lists_exports_and_resumes_the_same_on_postgresql(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama, postgres_url: str
) -> None:
    hang_b, hang_c = Hang(text="thinking "), Hang(text="pondering ")
    model.script_for(
        "weather", ToolCalls([("tools__echo", {"text": "sunny"})]), Text("It is sunny."),
        Text("Still sunny tomorrow."),
    )
    model.script_for("doomed", ToolCalls([("tools__echo", {"text": "before"})]), hang_b, Text("Resumed B."))
    model.script_for("stranded", ToolCalls([("tools__echo", {"text": "c"})]), hang_c, Text("Resumed C."))
    model.script_for("branch", Text("D1"), Text("D2"), Text("D3 on PostgreSQL"))

    # On SQLite: A completes with a tool call; B's worker is killed mid-run and a new worker
    # records it interrupted; C's worker is killed too, and nothing records it: the copy finds
    # it ``running``, a dead worker's.
    worker = start_worker(sophos_env)
    api = start_api(sophos_env)
    a, run_a = chat(api.url, "weather please")
    assert read_sse(api.url, a, timeout=30).text == "It is sunny."
    # D forks (Branches): its message edited, then its first branch followed again.
    d, _ = chat(api.url, "branch me")
    assert read_sse(api.url, d, timeout=30).text == "D1"
    first = get_json(api.url, f"/api/conversations/{d}")["messages"][0]["id"]
    fork(api.url, "/api/chat", {"conversation": d, "message": "branch me again", "replaces": first})
    assert read_sse(api.url, d, timeout=30).text == "D2"
    fork(api.url, f"/api/conversations/{d}/branch", {"message": first})
    assert read_sse(api.url, d, timeout=30)[-1].data["status"] == "completed"
    b, _ = chat(api.url, "doomed run")
    kill_mid_run(worker, hang_b)
    worker = start_worker(sophos_env)
    wait_for(lambda: status_of(api.url, b) == "interrupted", timeout=20, message="B recorded interrupted")
    c, _ = chat(api.url, "stranded run")
    kill_mid_run(worker, hang_c)
    before = snapshot(api.url)
    assert {k: v["status"] for k, v in before["list"].items()} == {
        a: "completed", b: "interrupted", c: "running", d: "completed",
    }
    assert [m["content"] for m in before["detail"][d]["messages"]] == ["branch me", "D1"]
    assert before["detail"][b]["resumable"] is True

    started = time.monotonic()
    done = copy_to(sophos_env, postgres_url)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    summary = SUMMARY.search(done.stdout)
    assert summary, done.stdout
    conversations, runs, threads, checkpoints, writes = map(int, summary.groups())
    assert (conversations, runs, threads) == (4, 6, 4)
    counts = row_counts(postgres_url)
    assert (counts["conversations"], counts["runs"]) == (4, 6)
    assert (counts["checkpoints"], counts["checkpoint_writes"]) == (checkpoints, writes)
    print(f"copy: {took:.2f}s for {checkpoints} checkpoints and {writes} writes ({done.stdout.strip()})")
    api.stop()

    # On PostgreSQL: C's run has no lease, so the first worker records it interrupted at start-up.
    pg = sophos_env.with_(DATABASE_URL=postgres_url, RUN_LEASE_SECONDS=3)
    start_worker(pg)
    api = start_api(pg)
    wait_for(lambda: status_of(api.url, c) == "interrupted", timeout=20, message="C recorded interrupted")
    after = snapshot(api.url)
    assert after["runs"][run_a] == before["runs"][run_a] and "breakdown" in after["runs"][run_a]
    for conversation in (a, b, d):  # D: the branch it follows, and its fork point, the same
        assert after["list"][conversation] == before["list"][conversation]
        assert after["detail"][conversation] == before["detail"][conversation]
        assert after["export"][conversation] == before["export"][conversation]
    # C as recovery on SQLite would have recorded it: same thread, now interrupted and resumable.
    c_before, c_after = before["list"][c], after["list"][c]
    same = ("id", "title", "createdAt")
    assert {k: c_after[k] for k in same} == {k: c_before[k] for k in same}
    assert c_after["messageCount"] == len(before["detail"][c]["messages"]) == 3  # counted by recovery
    assert c_after["error"]["code"] == "INTERRUPTED" and after["detail"][c]["resumable"] is True
    assert after["detail"][c]["messages"] == before["detail"][c]["messages"]
    assert after["export"][c][1] == before["export"][c][1]  # every checkpoint, its messages the same

    # Both interrupted conversations resume on PostgreSQL; the finished tool steps are not repeated.
    for conversation, answer in ((b, "Resumed B."), (c, "Resumed C.")):
        _, run = chat(api.url, conversation=conversation, resume=True)
        events = read_sse(api.url, conversation, timeout=30)
        assert events[-1].event == "end" and events[-1].data["run"] == run
        messages = get_json(api.url, f"/api/conversations/{conversation}")["messages"]
        assert messages[-1]["role"] == "assistant" and messages[-1]["content"] == answer
        earlier = before["detail"][conversation]["messages"]
        assert messages[: len(earlier)] == earlier
    echoed = [call["args"]["text"] for call in tool_calls(sophos_env.tools_log, "echo")]
    assert echoed == ["sunny", "before", "c"]

    # And the completed one continues, with its history.
    chat(api.url, "and tomorrow?", conversation=a)
    assert read_sse(api.url, a, timeout=30).text == "Still sunny tomorrow."
    detail = get_json(api.url, f"/api/conversations/{a}")
    assert detail["messages"][: len(before["detail"][a]["messages"])] == before["detail"][a]["messages"]
    assert [m["content"] for m in detail["messages"][-2:]] == ["and tomorrow?", "Still sunny tomorrow."]
    assert listed(api.url)[a]["messageCount"] == before["list"][a]["messageCount"] + 2

    # D forks on PostgreSQL too: another answer to its first message, a third branch.
    fork(api.url, "/api/chat", {"conversation": d, "regenerate": first})
    assert read_sse(api.url, d, timeout=30).text == "D3 on PostgreSQL"
    messages = get_json(api.url, f"/api/conversations/{d}")["messages"]
    assert [m["content"] for m in messages] == ["branch me", "D3 on PostgreSQL"]
    assert (messages[0]["branch"]["index"], messages[0]["branch"]["count"]) == (3, 3)


def test_the_copy_refuses_a_target_in_use_a_running_worker_and_a_bad_url(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama, postgres_url: str
) -> None:
    model.script(Text("hello"))
    worker = start_worker(sophos_env)
    api = start_api(sophos_env)
    conversation, _ = chat(api.url, "hi")
    assert read_sse(api.url, conversation, timeout=30).text == "hello"

    refused = copy_to(sophos_env, postgres_url)  # the worker still writes the file
    assert refused.returncode == 2 and "a worker is running" in refused.stderr, refused.stderr
    assert worker.stop() == 0

    for args, problem in (
        (("sqlite:///elsewhere.db",), "must be a postgresql:// URL"),
        (("postgresql://postgres@127.0.0.1:5432",), "names no database"),
        ((), "usage: python -m worker --copy-to"),
    ):
        refused = copy_to(sophos_env, *args)
        assert refused.returncode == 2 and problem in refused.stderr, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1 and refused.stdout == ""
    missing = copy_to(sophos_env.with_(DATABASE_PATH=str(sophos_env.root / "nowhere.db")), postgres_url)
    assert missing.returncode == 2 and "no SQLite database" in missing.stderr, missing.stderr
    assert not (sophos_env.root / "nowhere.db").exists()
    with psycopg.connect(postgres_url) as conn:  # nothing was created by the refusals
        assert conn.execute("SELECT to_regclass('conversations')").fetchone() == (None,)

    assert copy_to(sophos_env, postgres_url).returncode == 0
    copied = row_counts(postgres_url)
    again = copy_to(sophos_env, postgres_url)
    assert again.returncode == 2, again.stderr
    assert "is not empty (it holds conversations, runs, checkpoints" in again.stderr
    assert row_counts(postgres_url) == copied
    assert copied["conversations"] == 1
