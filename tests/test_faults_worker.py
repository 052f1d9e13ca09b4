"""Kill -9 of the worker at every step boundary of a run with two tool rounds, and again and again.

Each case runs the same script twice: once hit by the fault (then resumed), once
uninterrupted on a fresh conversation. The two transcripts must be equal, and the
executions counted at the model server and in the tools' log must be equal too,
except for the one step that was in flight when the worker died (the crash
semantics, docs/crash-semantics.md: the step in flight runs again; a checkpointed step never does).

Checkpoint writes of a fresh run with two tool rounds, as the fault hooks count them
(``SOPHOS_FAULT_KILL_AFTER_CHECKPOINT=N`` / ``..._BEFORE_CHECKPOINT=N``, worker/faults.py):

    1 input   2 after START   3 after agent (echo call)   4 after tools (echo ran)
    5 after agent (add call)   6 after tools (add ran)   7 after agent (final answer)
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

import pytest

from tests.fakes.ollama import FakeOllama, Hang, Reply, Text, ToolCalls
from tests.support.client import get_json, post_chat, read_sse, tool_calls, wait_for
from tests.support.env import SophosEnv
from tests.support.faults import (
    Executions,
    accepted,
    call_counters,
    database_integrity,
    queue_is_clean,
    recorded_after_crash,
    transcript,
)
from tests.support.procs import wait_worker_ready

pytestmark = [pytest.mark.fault, pytest.mark.backends]

ECHO = ToolCalls([("tools__echo", {"text": "one"})])
ADD = ToolCalls([("tools__add", {"a": 2, "b": 3})])
SLOW = ToolCalls([("tools__slow", {"seconds": 1.0})])
FINAL = Text("Two rounds done.")


@pytest.fixture
def env(sophos_env: SophosEnv) -> SophosEnv:
    return sophos_env


def start_both(worker_env: SophosEnv, api_env: SophosEnv, start_worker, start_api):
    """Start a worker and an API side by side (each start is mostly imports)."""
    worker = start_worker(worker_env, wait_ready=False)
    api = start_api(api_env)
    wait_worker_ready(worker, worker_env.redis_url)
    return worker, api


@dataclass(frozen=True)
class Case:
    #: variables for the worker that dies (a fault hook), or none: killed from outside
    hook: dict[str, int] = field(default_factory=dict)
    #: the script the model plays for the faulted run and its resume
    script: tuple[Reply, ...] = (ECHO, ADD, FINAL)
    #: the same conversation without a fault
    baseline: tuple[Reply, ...] = (ECHO, ADD, FINAL)
    #: what to wait for before ``kill -9`` from outside: "hang" (model streaming), "slow" (tool running)
    kill_during: str | None = None
    #: executions the fault makes happen twice (the step in flight)
    repeated: Executions = field(default_factory=lambda: Executions(0, {}))
    #: model calls made when the worker died
    model_calls_at_kill: int = 0


def _hang() -> Hang:
    return Hang(text="thinking ", then=ADD)


# The boundaries not listed here are hit by the five-kills chain below (after START; after
# the final checkpoint, of a resumed run) and by test_crash.py (before the input checkpoint;
# after the final checkpoint of a fresh run).
CASES = {
    "after-input-checkpoint": Case(hook={"SOPHOS_FAULT_KILL_AFTER_CHECKPOINT": 1}),
    "after-first-model-step": Case(hook={"SOPHOS_FAULT_KILL_AFTER_CHECKPOINT": 3}, model_calls_at_kill=1),
    # The tool ran and its result was saved (LangGraph's put_writes) but the step's checkpoint
    # was not written: the resume applies the saved result instead of running the tool again.
    "tool-ran-checkpoint-not-written": Case(
        hook={"SOPHOS_FAULT_KILL_BEFORE_CHECKPOINT": 4}, model_calls_at_kill=1
    ),
    "after-first-tool-step": Case(hook={"SOPHOS_FAULT_KILL_AFTER_CHECKPOINT": 4}, model_calls_at_kill=1),
    "after-second-model-step": Case(hook={"SOPHOS_FAULT_KILL_AFTER_CHECKPOINT": 5}, model_calls_at_kill=2),
    "after-second-tool-step": Case(hook={"SOPHOS_FAULT_KILL_AFTER_CHECKPOINT": 6}, model_calls_at_kill=2),
    "while-the-model-streams": Case(
        script=(ECHO, _hang(), ADD, FINAL), kill_during="hang",
        repeated=Executions(1, {}), model_calls_at_kill=2,
    ),
    "while-a-tool-runs": Case(
        script=(ECHO, SLOW, FINAL), baseline=(ECHO, SLOW, FINAL), kill_during="slow",
        repeated=Executions(0, {"slow": 1}), model_calls_at_kill=2,
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_kill_at_a_step_boundary_then_resume_equals_an_uninterrupted_run(
    name: str, env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    case = CASES[name]
    # A Hang is single-use: each run of the test gets fresh replies.
    script = tuple(_hang() if isinstance(r, Hang) else r for r in case.script)
    model.script(*script)
    doomed, api = start_both(env.with_(**case.hook), env, start_worker, start_api)
    conversation, run = accepted(api.url, "two rounds please")

    if case.kill_during == "hang":
        next(r for r in script if isinstance(r, Hang)).wait_started(20)
        doomed.kill()
    elif case.kill_during == "slow":
        wait_for(lambda: tool_calls(env.tools_log, "slow"), timeout=20)
        doomed.kill()
    assert doomed.wait(20) == -signal.SIGKILL
    assert model.calls == case.model_calls_at_kill
    assert database_integrity(env) == "ok"

    start_worker(env)
    info = recorded_after_crash(api.url, run)
    assert info["status"] == "interrupted" and info["error"]["code"] == "INTERRUPTED", info
    stream = read_sse(api.url, conversation)
    assert stream[-1].event == "chat-error" and stream[-1].data["code"] == "INTERRUPTED"
    detail = get_json(api.url, f"/api/conversations/{conversation}")
    assert detail["resumable"] is True
    assert detail["conversation"]["status"] == "interrupted"
    assert queue_is_clean(env.redis_url, conversation) == []

    _, resumed = accepted(api.url, conversation=conversation, resume=True)
    events = read_sse(api.url, conversation)
    assert events[-1].event == "end" and events[-1].data["run"] == resumed
    assert get_json(api.url, f"/api/conversations/{conversation}")["resumable"] is False
    after_fault = Executions.now(model, env.tools_log)
    # /metrics counts the model calls the resume made again, and only those.
    assert call_counters(api.url)["sophos_model_calls_repeated_total"] == case.repeated.model

    model.script(*case.baseline)
    control, _ = accepted(api.url, "two rounds please")
    assert read_sse(api.url, control)[-1].event == "end"
    uninterrupted = Executions.now(model, env.tools_log) - after_fault

    assert transcript(api.url, conversation) == transcript(api.url, control)
    assert after_fault - case.repeated == uninterrupted
    assert database_integrity(env) == "ok"


def test_killed_five_times_in_a_row_never_stuck_and_ends_right(
    env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    """One conversation crashed five times, each time somewhere else, resumed after each crash."""
    hang = Hang(text="almost ", then=FINAL)
    model.script(ECHO, SLOW, hang, FINAL)
    worker, api = start_both(env.with_(SOPHOS_FAULT_KILL_AFTER_CHECKPOINT=2), env, start_worker, start_api)
    conversation, first = accepted(api.url, "two rounds please")
    runs = [first]

    def crashed(worker) -> None:
        """The worker died; a new one must leave nothing stuck and accept a resume at once."""
        assert worker.wait(20) == -signal.SIGKILL
        assert database_integrity(env) == "ok"

    def restart(**hook: int):
        new = start_worker(env.with_(**hook))
        assert recorded_after_crash(api.url, runs[-1])["status"] == "interrupted"
        for status in ("running", "queued"):
            assert get_json(api.url, "/api/runs", status=status, conversation=conversation)["runs"] == []
        assert queue_is_clean(env.redis_url, conversation) == []
        assert get_json(api.url, f"/api/conversations/{conversation}")["resumable"] is True
        runs.append(accepted(api.url, conversation=conversation, resume=True)[1])
        return new

    crashed(worker)  # 1: after the START step, before any model call
    assert model.calls == 0
    worker = restart(SOPHOS_FAULT_KILL_BEFORE_CHECKPOINT=1)
    crashed(worker)  # 2: the model step ran (its result saved) but the resume wrote no checkpoint
    assert model.calls == 1
    worker = restart()
    # A resume has no message of its own: the user is told to resume, not to send it again.
    assert "resume" in get_json(api.url, f"/api/runs/{runs[-2]}")["error"]["message"]
    wait_for(lambda: tool_calls(env.tools_log, "slow"), timeout=20)
    assert model.calls == 2  # the saved model step was not asked again
    worker.kill()
    crashed(worker)  # 3: while the slow tool runs
    worker = restart()
    hang.wait_started(20)
    worker.kill()
    crashed(worker)  # 4: while the model streams its final answer
    worker = restart(SOPHOS_FAULT_KILL_AFTER_CHECKPOINT=1)
    crashed(worker)  # 5: after the final checkpoint, before the outcome was recorded
    start_worker(env)
    recorded_after_crash(api.url, runs[-1])

    detail = get_json(api.url, f"/api/conversations/{conversation}")
    assert detail["resumable"] is False and detail["conversation"]["status"] == "interrupted"
    assert detail["messages"][-1]["content"] == "Two rounds done."
    listed = get_json(api.url, "/api/runs", conversation=conversation)["runs"]
    assert sorted(r["id"] for r in listed) == sorted(runs) and len(runs) == 5
    assert {r["status"] for r in listed} == {"interrupted"}
    refused = post_chat(api.url, conversation=conversation, resume=True)
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "RUN_NOT_RESUMABLE"
    crashes = Executions.now(model, env.tools_log)

    model.script(ECHO, SLOW, FINAL)
    control, _ = accepted(api.url, "two rounds please")
    assert read_sse(api.url, control)[-1].event == "end"
    uninterrupted = Executions.now(model, env.tools_log) - crashes
    assert transcript(api.url, conversation) == transcript(api.url, control)
    # Two steps were in flight when the worker died: the slow tool and the model's final answer.
    assert crashes - Executions(1, {"slow": 1}) == uninterrupted
    # The conversation goes on as any other.
    model.script(Text("Still here."))
    accepted(api.url, "and now?", conversation)
    assert read_sse(api.url, conversation).text == "Still here."
