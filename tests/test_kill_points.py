"""Issue 29, part 8: a worker killed at every point of a tool call's way, on both engines.

One model turn makes three calls, each its own task: ``echo`` (read-only: its MCP annotation
says so), ``add`` and ``slow`` (``safeToRepeat: false`` in mcp.json: calls that act). The kill
falls on ``slow``, the slow one, at each point below; its siblings have finished by then (a held
call waits for them, worker/faults.py). The tools server logs every execution with the
idempotency key it received (tests/fakes/tools_server.py), so executions are counted per call
across the worker that died and the one that resumes. At each point the test asserts how many
times each call ran, what the resume did with ``slow`` (sent for the first time, answered from
the ledger, or asked about as ``uncertain`` and sent again on approval, with its key), and that
the transcript is whole: every call answered once, the final answer there.

Cheap by design (the suite's budget): the API and the database live for the whole module (one
per engine), each case is a conversation of its own, one worker started with the fault and one
plain worker to resume (on PostgreSQL started beside the doomed one). Worker start-ups are most
of a case's time.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import redis as redis_sync

from tests.fakes.ollama import FakeOllama, Text, ToolCalls
from tests.support.client import get_json, read_sse, tool_calls, wait_for
from tests.support.env import SophosEnv, make_sophos_env, mcp_servers
from tests.support.faults import (
    accepted,
    call_counters,
    database_integrity,
    ledger_rows,
    recorded_after_crash,
)
from tests.support.ports import free_port
from tests.support.procs import ProcessGroup, ServiceProcess, wait_worker_ready
from tests.support.redis_server import RedisServer

pytestmark = [pytest.mark.fault]

SLOW_SECONDS = 0.8
#: seconds each engine's cases took, reported at the module's end (the matrix's cost)
SPENT: dict[str, float] = {}


@dataclass(frozen=True)
class Point:
    #: the doomed worker's fault variables
    hook: dict[str, str] = field(default_factory=dict)
    #: killed from outside once: "held" (the hook logged it holds ``slow``), "running" (the
    #: tools server started ``slow``); None: the hook kills the worker itself
    kill_when: str | None = None
    #: executions of ``slow`` when the worker died
    ran_at_kill: int = 1
    #: what the resume does with ``slow``: "send" (never sent: sent once), "answer" (from the
    #: ledger), "ask" (uncertain: asked about, approved, sent again), None (nothing: the step
    #: was checkpointed)
    resume: str | None = "ask"
    #: executions of ``slow`` in the end, and the ledger's attempts of it
    ran: int = 2
    attempts: int = 2


POINTS = {
    "before-intent": Point(hook={"SOPHOS_FAULT_HOLD_CALL": "before_intent:tools__slow"}, kill_when="held",
                           ran_at_kill=0, resume="send", ran=1, attempts=1),
    # The intent is committed, the request never left: the ledger cannot know that, and asks.
    "after-intent": Point(hook={"SOPHOS_FAULT_HOLD_CALL": "after_intent:tools__slow"}, kill_when="held",
                          ran_at_kill=0, ran=1),
    "while-the-server-executes": Point(kill_when="running"),
    "after-the-result-before-the-outcome": Point(
        hook={"SOPHOS_FAULT_HOLD_CALL": "before_outcome:tools__slow"}, kill_when="held"),
    # Outcomes: echo, add (at once), slow (0.8 s later). Killed before LangGraph saved its writes.
    "after-the-outcome": Point(hook={"SOPHOS_FAULT_KILL_AFTER_OUTCOME": "3"}, resume="answer", ran=1,
                               attempts=1),
    # Checkpoints: 1 input, 2 after START, 3 after the model's turn, 4 after the three calls.
    "after-the-steps-checkpoint": Point(hook={"SOPHOS_FAULT_KILL_AFTER_CHECKPOINT": "4"}, resume=None, ran=1,
                                        attempts=1),
}


@dataclass
class Matrix:
    env: SophosEnv
    api: str
    engine: str


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def matrix(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer,
    fake_ollama: FakeOllama,
) -> Iterator[Matrix]:
    """One API and one database per engine for all the module's cases."""
    root = tmp_path_factory.mktemp(f"kill-points-{request.param}")
    env = make_sophos_env(root, redis_url=redis_server.url, ollama_url=fake_ollama.url, api_port=free_port())
    if request.param == "postgresql":
        url = request.getfixturevalue("postgres_server").create_database()
        # A short lease, so a dead worker's run is taken over within seconds.
        env = env.with_(DATABASE_URL=url, RUN_LEASE_SECONDS=3)
    tools = mcp_servers(env.tools_log, root)["mcpServers"]["tools"]  # type: ignore[index]
    env.write_mcp_config({"mcpServers": {"tools": {**tools, "safeToRepeat": {"add": False, "slow": False}}}})
    with redis_sync.Redis.from_url(redis_server.url) as client:
        client.flushall()
    group = ProcessGroup(log_dir=root / "api-logs", cwd=root)
    try:
        yield Matrix(env, str(group.start_api(env).url), request.param)
    finally:
        group.close()
        spent = SPENT.get(request.param)
        if spent is not None:
            print(f"\nkill-point matrix on {request.param}: {spent:.1f} s")


def _settled(env: SophosEnv, conversation: str) -> bool:
    """``echo`` and ``add`` have their outcomes in the ledger."""
    rows = ledger_rows(env, conversation)
    return sum(r["state"] == "done" and r["tool"] != "tools__slow" for r in rows) == 2


def _runs(env: SophosEnv, since: int) -> Callable[[str], list[str | None]]:
    """The keys of each execution of a tool logged after the first ``since`` (this case's)."""
    return lambda tool: [e.get("key") for e in tool_calls(env.tools_log)[since:] if e["tool"] == tool]


@pytest.mark.parametrize("name", list(POINTS))
def test_a_kill_at_each_point_of_a_call_never_repeats_a_finished_call_and_asks_about_one_that_may_have_run(
    name: str, matrix: Matrix, start_worker: Callable[..., ServiceProcess], model: FakeOllama
) -> None:
    began = time.monotonic()
    point, env, api = POINTS[name], matrix.env, matrix.api
    calls: list[tuple[str, dict[str, Any]]] = [
        ("tools__echo", {"text": name}), ("tools__add", {"a": 2, "b": len(name)}),
        ("tools__slow", {"seconds": SLOW_SECONDS}),
    ]
    model.script(ToolCalls(calls), Text(f"Three calls made ({name})."))
    ran = _runs(env, len(tool_calls(env.tools_log)))
    doomed = start_worker(env.with_(**point.hook))
    conversation, run = accepted(api, f"three calls, killed {name}")
    survivor: ServiceProcess | None = None
    if matrix.engine == "postgresql":
        # Workers share PostgreSQL: the one that resumes starts while the doomed one runs (once it
        # holds the run), which saves a start-up per case; it takes the run when its lease lapses.
        wait_for(lambda: get_json(api, f"/api/runs/{run}")["status"] == "running", message="run taken")
        survivor = start_worker(env, wait_ready=False)

    if point.kill_when == "held":
        wait_for(lambda: any(r.get("event") == "faults.holding" for r in doomed.log_records())
                 and _settled(env, conversation), timeout=30, message="slow held, its siblings done")
        doomed.kill()
    elif point.kill_when == "running":
        def running() -> bool:
            slow_keys = {r["key"] for r in ledger_rows(env, conversation) if r["tool"] == "tools__slow"}
            return _settled(env, conversation) and any(
                e.get("key") in slow_keys for e in tool_calls(env.tools_log, "slow"))
        wait_for(running, timeout=30, message="slow running, its siblings done")
        doomed.kill()
    assert doomed.wait(30) == -signal.SIGKILL
    before = {r["tool"]: r for r in ledger_rows(env, conversation)}
    assert len(ran("echo")) == len(ran("add")) == 1
    assert len(ran("slow")) == point.ran_at_kill
    assert ("tools__slow" in before) == (point.ran_at_kill > 0 or point.resume != "send")

    if survivor is None:
        survivor = start_worker(env)
    else:
        wait_worker_ready(survivor, env.redis_url)
    counted = call_counters(api)
    assert recorded_after_crash(api, run)["status"] == "interrupted"
    detail = get_json(api, f"/api/conversations/{conversation}")
    assert detail["resumable"] is True
    # The detail's resume plan says what the resume will do: a sibling whose task writes LangGraph
    # lost is answered from the ledger; slow as the point says.
    answered = {m["toolCallId"] for m in detail["messages"] if m["role"] == "tool"}
    [turn] = [m for m in detail["messages"] if m.get("toolCalls")]
    ids = {c["name"]: c["id"] for c in turn["toolCalls"]}
    expected = {ids[t]: "answer" for t in ("tools__echo", "tools__add") if ids[t] not in answered}
    if point.resume is not None:
        expected[ids["tools__slow"]] = point.resume
    assert {p["id"]: p["action"] for p in detail["resumePlan"]} == expected

    _, resumed = accepted(api, conversation=conversation, resume=True)
    events = read_sse(api, conversation)
    if point.resume == "ask":
        assert events.types[-2:] == ["approval", "end"] and events[-1].data["status"] == "waiting"
        assert events.of("approval")[0].data["requests"] == [{
            "id": ids["tools__slow"], "name": "tools__slow", "arguments": {"seconds": SLOW_SECONDS},
            "kind": "uncertain", "attempts": 1,
        }]
        assert len(ran("slow")) == point.ran_at_kill  # not sent before the decision
        with httpx.Client(base_url=api, timeout=10.0, trust_env=False) as http:
            decided = http.post("/api/chat", json={
                "conversation": conversation, "decisions": [{"id": ids["tools__slow"], "action": "approve"}],
            })
        assert decided.status_code == 202, decided.text
        resumed = decided.json()["run"]
        events = read_sse(api, conversation)
    assert events[-1].data == {"conversation": conversation, "run": resumed, "status": "completed"}
    assert "approval" not in events.types
    answered_from_ledger = {r.get("tool_call_id") for r in survivor.log_records()
                            if r.get("event") == "tool_call.answered_from_ledger"}
    assert (ids["tools__slow"] in answered_from_ledger) == (point.resume == "answer")

    rows = {r["tool"]: r for r in ledger_rows(env, conversation)}
    assert (len(ran("echo")), len(ran("add")), len(ran("slow"))) == (1, 1, point.ran)
    # Every execution with its call's one key, whatever the attempt.
    assert {t: set(ran(t.removeprefix("tools__"))) for t in rows} == {t: {r["key"]} for t, r in rows.items()}
    assert {t: (r["state"], r["attempt"]) for t, r in rows.items()} == {
        "tools__echo": ("done", 1), "tools__add": ("done", 1), "tools__slow": ("done", point.attempts),
    }

    # The transcript is whole: each call answered once, with its real result, and the answer.
    detail = get_json(api, f"/api/conversations/{conversation}")
    messages = detail["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "tool", "assistant"]
    results = {m["toolCallId"]: m["content"] for m in messages if m["role"] == "tool"}
    assert results == {ids["tools__echo"]: name, ids["tools__add"]: str(2 + len(name)),
                       ids["tools__slow"]: f"slept {SLOW_SECONDS}s"}
    assert messages[-1]["content"] == f"Three calls made ({name})."
    assert detail["resumable"] is False and detail["resumePlan"] is None
    assert model.calls == 2  # no model call was made twice: the kill fell on the tools' step
    moved = call_counters(api) - counted
    assert moved["sophos_model_calls_repeated_total"] == 0
    assert moved["sophos_tool_calls_repeated_total:decided"] == (point.resume == "ask")
    assert moved["sophos_tool_calls_total:answered"] >= (point.resume == "answer")
    assert database_integrity(env) == "ok"
    survivor.kill()
    SPENT[matrix.engine] = SPENT.get(matrix.engine, 0.0) + time.monotonic() - began
