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

The third call can be ``tasks__long`` instead of ``slow``: a call made as an MCP task on a remote task
server (tests/fakes/task_server.py over Streamable HTTP, in a process of its own that outlives the
worker). The kill falls on it after the server made the task and before its id is committed (asked
about, like any call that may have run: never a second task sent silently), after the id's commit
while the task works, and after the task completed before its outcome is recorded (both answered
from the task, the tool having run once). A worker stopped (SIGTERM) past ``SHUTDOWN_TIMEOUT`` while
it follows a task cancels the task on its server.

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

import pytest

from tests.fakes.ollama import FakeOllama, Text, ToolCalls
from tests.support.client import get_json, read_sse, tool_calls, wait_for
from tests.support.env import TASK_SERVER, SophosEnv, stdio_tools
from tests.support.faults import (
    accepted,
    call_counters,
    database_integrity,
    ledger_rows,
    recorded_after_crash,
)
from tests.support.http import http_client
from tests.support.procs import ServiceProcess, wait_worker_ready
from tests.support.redis_server import RedisServer
from tests.support.tool_servers import RemoteTools, task_endings
from tests.support.tool_stacks import ToolStack, tool_stack

pytestmark = [pytest.mark.fault]

SLOW_SECONDS = 0.8
#: how long the task the kill falls on while it works runs: long past its siblings' end and the kill
WORKING_SECONDS = 3.0
FROM_TASK = "sophos_tool_calls_answered_from_task_total"
#: seconds each engine's cases took, reported at the module's end (the matrix's cost)
SPENT: dict[str, float] = {}


@dataclass(frozen=True)
class Point:
    #: the doomed worker's fault variables
    hook: dict[str, str] = field(default_factory=dict)
    #: the call the kill falls on
    target: str = "tools__slow"
    #: the third call: ``slow``, or ``tasks__long`` made as an MCP task (for ``seconds``)
    task: bool = False
    seconds: float = SLOW_SECONDS
    #: the task's state in the ledger when the worker died (None: its id was never committed)
    task_at_kill: str | None = None
    #: killed from outside once: "held" (the hook logged it holds the target), "running" (the
    #: tools server started it), "task" (its task id is committed); None: the hook kills the
    #: worker itself
    kill_when: str | None = None
    #: executions of the target when the worker died
    ran_at_kill: int = 1
    #: what the resume does with the target: "send" (never sent: sent once), "answer" (from the
    #: ledger), "resend" (may have run, safe to repeat: sent again without asking), "ask"
    #: (uncertain: asked about, approved, sent again), "task" (asked of its task's server),
    #: None (nothing: the step was checkpointed)
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
    # MCP tasks. The server made the task, its id is not committed: the call may have run, and
    # nothing says which task it is, so it is asked about (approved: a second task, same key).
    "after-the-task-is-made-before-its-id-is-committed": Point(
        hook=_hold("before_task_state", "tasks__long"), task=True, target="tasks__long", kill_when="held"),
    # The id committed, the task working: the resume asks its server, and its result is the outcome.
    "while-the-task-works": Point(task=True, target="tasks__long", seconds=WORKING_SECONDS, kill_when="task",
                                  task_at_kill="working", resume="task", ran=1, attempts=1),
    "after-the-task-completed-before-the-outcome": Point(
        hook=_hold("before_outcome", "tasks__long"), task=True, target="tasks__long", kill_when="held",
        task_at_kill="completed", resume="task", ran=1, attempts=1),
}


def _servers(env: SophosEnv, tasks: RemoteTools) -> dict[str, Any]:
    return {"tools": {**stdio_tools(env), "safeToRepeat": {"add": False, "slow": False}},
            "tasks": {"url": tasks.url}}


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def matrix(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer,
    fake_ollama: FakeOllama,
) -> Iterator[ToolStack]:
    """One API and one database per engine for all the module's cases (no worker: each case starts
    its own)."""
    root = tmp_path_factory.mktemp(f"kill-points-{request.param}")
    with tool_stack(request, root, redis_server.url, fake_ollama.url, _servers, script=TASK_SERVER,
                    worker=False) as stack:
        yield stack
    spent = SPENT.get(request.param)
    if spent is not None:
        print(f"\nkill-point matrix on {request.param}: {spent:.1f} s")


def _settled(env: SophosEnv, conversation: str, target: str) -> bool:
    """The calls other than ``target`` have their outcomes in the ledger."""
    rows = ledger_rows(env, conversation)
    return sum(r["state"] == "done" and r["tool"] != target for r in rows) == 2


def _runs(env: SophosEnv, since: int) -> Callable[[str], list[str | None]]:
    """The keys of each execution of a tool (``server__tool``) logged after the first ``since`` (this
    case's)."""
    return lambda tool: [e.get("key") for e in tool_calls(env.tools_log)[since:]
                         if e["tool"] == tool.split("__", 1)[1]]


@pytest.mark.parametrize("name", list(POINTS))
def test_a_kill_at_each_point_of_a_call_never_repeats_a_finished_call_and_asks_about_one_that_may_have_run(
    name: str, matrix: ToolStack, start_worker: Callable[..., ServiceProcess], model: FakeOllama
) -> None:
    began = time.monotonic()
    point, env, api = POINTS[name], matrix.env, matrix.api
    if point.task and matrix.engine != "sqlite":
        # The task's id and state are the same SQL on both engines (worker/tools/ledger/records.py),
        # and tests/test_tool_tasks.py kills a worker mid-task on PostgreSQL too: SQLite here, for time.
        pytest.skip("MCP task points run on SQLite (tests/test_tool_tasks.py covers PostgreSQL)")
    third = ("tasks__long", {"seconds": point.seconds, "text": name}) if point.task else (
        "tools__slow", {"seconds": SLOW_SECONDS})
    arguments: dict[str, dict[str, Any]] = {
        "tools__echo": {"text": name}, "tools__add": {"a": 2, "b": len(name)}, third[0]: third[1],
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

    target = point.target
    if point.kill_when == "held":
        wait_for(lambda: any(r.get("event") == "faults.holding" for r in doomed.log_records())
                 and _settled(env, conversation, target), timeout=30, message="held, its siblings done")
        doomed.kill()
    elif point.kill_when == "running":
        def running() -> bool:
            keys = {r["key"] for r in ledger_rows(env, conversation) if r["tool"] == target}
            return _settled(env, conversation, target) and any(k in keys for k in ran(target))
        wait_for(running, timeout=30, message="running, its siblings done")
        doomed.kill()
    elif point.kill_when == "task":
        wait_for(lambda: _settled(env, conversation, target) and any(
            r["task_id"] for r in ledger_rows(env, conversation) if r["tool"] == target),
            timeout=30, message="its task id committed, its siblings done")
        doomed.kill()
    assert doomed.wait(30) == -signal.SIGKILL
    before = {r["tool"]: r for r in ledger_rows(env, conversation)}
    assert {t: len(ran(t)) for t in arguments} == {
        t: point.ran_at_kill if t == target else 1 for t in arguments
    }
    assert (target in before) == (point.ran_at_kill > 0 or point.resume != "send")
    if point.task:  # the task as the worker last knew it
        assert before[target]["task_state"] == point.task_at_kill, before[target]

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
        t: {"state": before[t]["state"], "attempts": 1, "key": before[t]["key"], **(
            {"task": {"id": before[t]["task_id"], "state": before[t]["task_state"]}}
            if before[t]["task_id"] else {})} if t in before else None
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
        assert len(ran(target)) == point.ran_at_kill  # not sent before the decision: no second task
        if point.kill_while_waiting:  # a question asked survives kill -9
            survivor.kill()
            assert survivor.wait(10) == -signal.SIGKILL
            workers.append(start_worker(env))
            detail = get_json(api, f"/api/conversations/{conversation}")
            assert detail["conversation"]["status"] == "waiting" and detail["pendingApproval"] == requests
        with http_client(base_url=api, timeout=10.0) as http:
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
    from_task = {r.get("tool_call_id") for r in logged if r.get("event") == "tool_call.answered_from_task"}
    assert (ids[target] in from_task) == (point.resume == "task")
    sent_again = [(r["tool"], r["reason"]) for r in logged if r.get("event") == "tool_call.sent_again"]
    assert sent_again == {"ask": [(target, "decided_approve")], "resend": [(target, "safe_to_repeat")]}.get(
        str(point.resume), [])

    rows = {r["tool"]: r for r in ledger_rows(env, conversation)}
    assert {t: len(ran(t)) for t in arguments} == {t: point.ran if t == target else 1 for t in arguments}
    # Every execution with its call's one key, whatever the attempt.
    assert {t: set(ran(t)) for t in rows} == {t: {r["key"]} for t, r in rows.items()}
    if point.task:  # the last task ran to its end once, and the ledger knows it so
        assert rows[target]["task_state"] == "completed"
        assert task_endings(env.tools_log, rows[target]["task_id"]) == ["done"]
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
                       ids[third[0]]: f"done: {name}" if point.task else f"slept {SLOW_SECONDS}s"}
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
    assert moved[FROM_TASK] == (point.resume == "task")
    assert database_integrity(env) == "ok"
    for worker in workers:
        worker.kill()
    SPENT[matrix.engine] = SPENT.get(matrix.engine, 0.0) + time.monotonic() - began


def test_a_worker_stopped_past_shutdown_timeout_cancels_the_task_it_follows(
    matrix: ToolStack, start_worker: Callable[..., ServiceProcess], model: FakeOllama
) -> None:
    """SIGTERM while a call made as an MCP task works, and the step does not end within
    ``SHUTDOWN_TIMEOUT``: the worker ends the run ``interrupted`` and the cut wait cancels the task on
    its server (worker/tools/tasks.py), which stops the tool. One engine: the cancel is the MCP
    session's, the same on both, and the matrix stays cheap."""
    if matrix.engine != "sqlite":
        pytest.skip("the task's cancel does not touch the engine: SQLite only, to keep the matrix cheap")
    began = time.monotonic()
    env, api = matrix.env, matrix.api
    model.script(ToolCalls([("tasks__long", {"seconds": 30, "text": "stopped"})]), Text("never"))
    worker = start_worker(env.with_(SHUTDOWN_TIMEOUT=1))
    conversation, run = accepted(api, "a task the worker stops for")
    task_id = wait_for(lambda: next((r["task_id"] for r in ledger_rows(env, conversation) if r["task_id"]),
                                    None), timeout=30, message="the call made as a task")
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    assert "worker.runs_abandoned" in worker.log_text()
    wait_for(lambda: task_endings(env.tools_log, task_id) == ["cancelled"], timeout=10,
             message="the task cancelled on its server")
    info = get_json(api, f"/api/runs/{run}")
    assert info["status"] == "interrupted" and "SHUTDOWN_TIMEOUT" in info["error"]["message"], info
    # The cancel's answer is recorded before the worker exits (a second cancel of the wait, arq's
    # after the run's, once let the worker exit first: the row still said working).
    rows = ledger_rows(env, conversation)
    assert [(r["state"], r["task_state"]) for r in rows] == [("intent", "cancelled")]
    SPENT[matrix.engine] = SPENT.get(matrix.engine, 0.0) + time.monotonic() - began
