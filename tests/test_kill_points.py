"""Issue 29, part 8: a worker killed at every point of a tool call's way, on both engines.

One model turn makes three calls, each its own task: ``echo`` (read-only: its MCP annotation
says so), ``add`` and ``slow`` (``safeToRepeat: false`` in mcp.json: calls that act). The kill
falls on ``slow``, the slow one, at each point below (and once on ``echo``, read-only); its
siblings have finished by then (a held call waits for them, worker/faults.py). The tools server
logs every execution with the idempotency key it received (tests/fakes/tools_server.py), so
executions are counted per call across the workers that died and the one that resumes. At each
point the test asserts how many times each call ran, what the resume did with the call the kill
fell on (sent for the first time, answered from the ledger, sent again without asking, or asked
about as ``uncertain`` and sent again on approval, always with its key), and that the transcript
is whole: every call answered once, the final answer there.

The points where the worker lives and the answer does not come (a call timed out, its server
died mid-call, its connection reset), for stdio and remote servers alike, are
tests/test_remote_tools.py: the same rule, a call that may have acted is asked about.

Cheap by design (the suite's budget): the API and the database live for the whole module (one
per engine), each case is a conversation of its own, one worker started with the fault and one
plain worker to resume (on PostgreSQL started beside the doomed one). Worker start-ups are most
of a case's time.
"""

from __future__ import annotations

import json
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
    #: the call the kill falls on
    target: str = "tools__slow"
    #: killed from outside once: "held" (the hook logged it holds the target), "running" (the
    #: tools server started it); None: the hook kills the worker itself
    kill_when: str | None = None
    #: executions of the target when the worker died
    ran_at_kill: int = 1
    #: what the resume does with the target: "send" (never sent: sent once), "answer" (from the
    #: ledger), "resend" (may have run, safe to repeat: sent again without asking), "ask"
    #: (uncertain: asked about, approved, sent again), None (nothing: the step was checkpointed)
    resume: str | None = "ask"
    #: executions of the target in the end, and the ledger's attempts of it
    ran: int = 2
    attempts: int = 2
    #: the worker that asked is killed too, while the conversation waits on the question
    kill_while_waiting: bool = False


def _hold(point: str, tool: str = "tools__slow") -> dict[str, str]:
    return {"SOPHOS_FAULT_HOLD_CALL": f"{point}:{tool}"}


POINTS = {
    "before-intent": Point(hook=_hold("before_intent"), kill_when="held", ran_at_kill=0, resume="send", ran=1,
                           attempts=1),
    # The intent is committed, the request never left: the ledger cannot know that, and asks.
    "after-intent": Point(hook=_hold("after_intent"), kill_when="held", ran_at_kill=0, ran=1),
    "while-the-server-executes": Point(kill_when="running", kill_while_waiting=True),
    "after-the-result-before-the-outcome": Point(hook=_hold("before_outcome"), kill_when="held"),
    # A read-only call in the same window is sent again, with its key, without asking.
    "after-the-result-of-the-read-only-call": Point(
        hook=_hold("before_outcome", "tools__echo"), target="tools__echo", kill_when="held", resume="resend"),
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


def _settled(env: SophosEnv, conversation: str, target: str) -> bool:
    """The calls other than ``target`` have their outcomes in the ledger."""
    rows = ledger_rows(env, conversation)
    return sum(r["state"] == "done" and r["tool"] != target for r in rows) == 2


def _runs(env: SophosEnv, since: int) -> Callable[[str], list[str | None]]:
    """The keys of each execution of a tool logged after the first ``since`` (this case's)."""
    return lambda tool: [e.get("key") for e in tool_calls(env.tools_log)[since:] if e["tool"] == tool]


@pytest.mark.parametrize("name", list(POINTS))
def test_a_kill_at_each_point_of_a_call_never_repeats_a_finished_call_and_asks_about_one_that_may_have_run(
    name: str, matrix: Matrix, start_worker: Callable[..., ServiceProcess], model: FakeOllama
) -> None:
    began = time.monotonic()
    point, env, api = POINTS[name], matrix.env, matrix.api
    arguments: dict[str, dict[str, Any]] = {
        "tools__echo": {"text": name}, "tools__add": {"a": 2, "b": len(name)},
        "tools__slow": {"seconds": SLOW_SECONDS},
    }
    model.script(ToolCalls(list(arguments.items())), Text(f"Three calls made ({name})."))
    ran = _runs(env, len(tool_calls(env.tools_log)))
    doomed = start_worker(env.with_(**point.hook))
    conversation, run = accepted(api, f"three calls, killed {name}")
    survivor: ServiceProcess | None = None
    if matrix.engine == "postgresql":
        # Workers share PostgreSQL: the one that resumes starts while the doomed one runs (once it
        # holds the run), which saves a start-up per case; it takes the run when its lease lapses.
        wait_for(lambda: get_json(api, f"/api/runs/{run}")["status"] == "running", message="run taken")
        survivor = start_worker(env, wait_ready=False)

    target, short = point.target, point.target.removeprefix("tools__")
    if point.kill_when == "held":
        wait_for(lambda: any(r.get("event") == "faults.holding" for r in doomed.log_records())
                 and _settled(env, conversation, target), timeout=30, message="held, its siblings done")
        doomed.kill()
    elif point.kill_when == "running":
        def running() -> bool:
            keys = {r["key"] for r in ledger_rows(env, conversation) if r["tool"] == target}
            return _settled(env, conversation, target) and any(k in keys for k in ran(short))
        wait_for(running, timeout=30, message="running, its siblings done")
        doomed.kill()
    assert doomed.wait(30) == -signal.SIGKILL
    before = {r["tool"]: r for r in ledger_rows(env, conversation)}
    assert {t: len(ran(t.removeprefix("tools__"))) for t in arguments} == {
        t: point.ran_at_kill if t == target else 1 for t in arguments
    }
    assert (target in before) == (point.ran_at_kill > 0 or point.resume != "send")

    if survivor is None:
        survivor = start_worker(env)
    else:
        wait_worker_ready(survivor, env.redis_url)
    workers = [survivor]
    counted = call_counters(api)
    assert recorded_after_crash(api, run)["status"] == "interrupted"
    # One LangGraph task per call: three "enter"s of the tools node, in one step.
    enters = [e.data for e in read_sse(api, conversation).of("trace")
              if e.data["event"] == "enter" and e.data["node"] == "tools"]
    assert len(enters) == 3 and len({e["step"] for e in enters}) == 1
    detail = get_json(api, f"/api/conversations/{conversation}")
    assert detail["resumable"] is True
    [turn] = [m for m in detail["messages"] if m.get("toolCalls")]
    ids = {c["name"]: c["id"] for c in turn["toolCalls"]}
    # The detail shows what the ledger knows of each call ...
    assert {c["name"]: c.get("ledger") for c in turn["toolCalls"]} == {
        t: {"state": before[t]["state"], "attempts": 1, "key": before[t]["key"]} if t in before else None
        for t in arguments
    }
    # ... and what the resume will do: a sibling whose task writes LangGraph lost is answered
    # from the ledger; the target as the point says.
    answered = {m["toolCallId"] for m in detail["messages"] if m["role"] == "tool"}
    expected = {ids[t]: "answer" for t in arguments if t != target and ids[t] not in answered}
    if point.resume is not None:
        expected[ids[target]] = point.resume
    assert {p["id"]: p["action"] for p in detail["resumePlan"]} == expected

    _, resumed = accepted(api, conversation=conversation, resume=True)
    events = read_sse(api, conversation)
    if point.resume == "ask":
        assert events.types[-2:] == ["approval", "end"] and events[-1].data["status"] == "waiting"
        requests = [{"id": ids[target], "name": target, "arguments": arguments[target], "kind": "uncertain",
                     "attempts": 1}]
        assert events.of("approval")[0].data["requests"] == requests
        assert len(ran(short)) == point.ran_at_kill  # not sent before the decision
        if point.kill_while_waiting:  # a question asked survives kill -9
            survivor.kill()
            assert survivor.wait(10) == -signal.SIGKILL
            workers.append(start_worker(env))
            detail = get_json(api, f"/api/conversations/{conversation}")
            assert detail["conversation"]["status"] == "waiting" and detail["pendingApproval"] == requests
        with httpx.Client(base_url=api, timeout=10.0, trust_env=False) as http:
            decided = http.post("/api/chat", json={
                "conversation": conversation, "decisions": [{"id": ids[target], "action": "approve"}],
            })
        assert decided.status_code == 202, decided.text
        resumed = decided.json()["run"]
        events = read_sse(api, conversation)
    assert events[-1].data == {"conversation": conversation, "run": resumed, "status": "completed"}
    assert "approval" not in events.types
    logged = [r for worker in workers for r in worker.log_records()]
    from_ledger = {r.get("tool_call_id") for r in logged
                   if r.get("event") == "tool_call.answered_from_ledger"}
    assert (ids[target] in from_ledger) == (point.resume == "answer")
    sent_again = [(r["tool"], r["reason"]) for r in logged if r.get("event") == "tool_call.sent_again"]
    assert sent_again == {"ask": [(target, "decided_approve")], "resend": [(target, "safe_to_repeat")]}.get(
        str(point.resume), [])

    rows = {r["tool"]: r for r in ledger_rows(env, conversation)}
    assert {t: len(ran(t.removeprefix("tools__"))) for t in arguments} == {
        t: point.ran if t == target else 1 for t in arguments
    }
    # Every execution with its call's one key, whatever the attempt.
    assert {t: set(ran(t.removeprefix("tools__"))) for t in rows} == {t: {r["key"]} for t, r in rows.items()}
    attempts = {t: point.attempts if t == target else 1 for t in arguments}
    assert {t: (r["state"], r["attempt"]) for t, r in rows.items()} == {
        t: ("done", n) for t, n in attempts.items()
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
    # Both exports say how often each call was sent, with which key.
    markdown = get_json(api, f"/api/conversations/{conversation}/export", raw=True)
    for t, r in rows.items():
        sent = "once" if attempts[t] == 1 else f"{attempts[t]} times"
        assert f"*Sent {sent} (idempotency key `{r['key']}`), its outcome recorded.*" in markdown
    jsonl = get_json(api, f"/api/conversations/{conversation}/export", raw=True, format="jsonl")
    exported = {c["name"]: c["ledger"] for line in jsonl.splitlines()
                for m in json.loads(line)["messages"] for c in m.get("toolCalls", [])}
    assert {t: (e["state"], e["attempts"], e["key"]) for t, e in exported.items()} == {
        t: ("done", attempts[t], r["key"]) for t, r in rows.items()
    }
    assert model.calls == 2  # no model call was made twice: the kill fell on the tools' step
    moved = call_counters(api) - counted
    assert moved["sophos_model_calls_repeated_total"] == 0
    assert moved["sophos_tool_calls_repeated_total:decided"] == (point.resume == "ask")
    assert moved["sophos_tool_calls_repeated_total:safe_to_repeat"] == (point.resume == "resend")
    assert moved["sophos_tool_calls_total:answered"] >= (point.resume == "answer")
    assert database_integrity(env) == "ok"
    for worker in workers:
        worker.kill()
    SPENT[matrix.engine] = SPENT.get(matrix.engine, 0.0) + time.monotonic() - began
