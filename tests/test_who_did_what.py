"""Who did what (DESIGN.md "People and what they may touch"): a run says who started it and who
cancelled it, a decided tool call who decided it.

Real processes: users made by ``sophos users add`` in the database the API and worker read, a
real worker and API on real Redis; the model is the fake Ollama, holding a run open with ``Hang``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from tests.fakes.ollama import FakeOllama, Hang, Text, ToolCalls
from tests.support.client import read_sse, wait_for
from tests.support.env import SophosEnv, require_approval
from tests.support.procs import ServiceProcess
from tests.support.users import add_user

TIMEOUT = 30.0


def ask(url: str, key: str, method: str, path: str, body: dict[str, Any] | None = None,
        **params: str) -> httpx.Response:
    return httpx.request(method, f"{url}{path}", json=body, params=params or None,
                         headers={"authorization": f"Bearer {key}"}, timeout=10)


def run_of(url: str, key: str, run_id: str) -> dict[str, Any]:
    answer = ask(url, key, "GET", f"/api/runs/{run_id}")
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def listed(url: str, key: str, conversation: str, run_id: str) -> dict[str, Any]:
    page = ask(url, key, "GET", "/api/runs", conversation=conversation).json()
    return next(r for r in page["runs"] if r["id"] == run_id)


def test_an_operator_cancelling_a_users_running_run_is_recorded(
    sophos_env: SophosEnv, model: FakeOllama, start_worker: Callable[..., ServiceProcess],
    start_api: Callable[..., ServiceProcess],
) -> None:
    alice = add_user(sophos_env, "alice")
    root = add_user(sophos_env, "root", "--operator")
    hang = Hang(text="Thinking")
    model.script(hang)
    start_worker(sophos_env)
    url = start_api(sophos_env).url
    try:
        accepted = ask(url, alice, "POST", "/api/chat", {"message": "think long"}).json()
        conversation, run_id = accepted["conversation"], accepted["run"]
        hang.wait_started(TIMEOUT)

        answer = ask(url, root, "POST", f"/api/runs/{run_id}/cancel")
        # 202: asked of the running run; 200: it had ended, cancelled, by the time the answer was made.
        assert answer.status_code in (200, 202), answer.text
        ended = wait_for(lambda: (r := run_of(url, alice, run_id))["status"] == "cancelled" and r,
                         TIMEOUT, message="the run recorded cancelled")
    finally:
        hang.release()
    assert ended["startedBy"] == "alice" and ended["owner"] == "alice"
    assert ended["cancelledBy"] == "root"
    assert listed(url, root, conversation, run_id)["cancelledBy"] == "root"
    assert listed(url, alice, conversation, run_id)["cancelledBy"] == "root"


def test_a_queued_run_cancelled_by_its_owner_says_so_on_both_apis(
    sophos_env: SophosEnv, start_api: Callable[..., ServiceProcess],
) -> None:
    alice = add_user(sophos_env, "alice")
    root = add_user(sophos_env, "root", "--operator")
    url = start_api(sophos_env).url  # no worker: the runs stay queued

    accepted = ask(url, alice, "POST", "/api/chat", {"message": "wait your turn"}).json()
    conversation, run_id = accepted["conversation"], accepted["run"]
    answer = ask(url, alice, "POST", f"/api/runs/{run_id}/cancel")
    assert answer.status_code == 200, answer.text
    assert answer.json()["cancelledBy"] == "alice"
    shown = run_of(url, alice, run_id)
    assert (shown["status"], shown["startedBy"], shown["cancelledBy"]) == ("cancelled", "alice", "alice")
    assert listed(url, alice, conversation, run_id)["cancelledBy"] == "alice"

    # The Agent Protocol's cancel records its caller alike: an operator's, of alice's run.
    thread = ask(url, alice, "POST", "/threads", {}).json()["thread_id"]
    made = ask(url, alice, "POST", f"/threads/{thread}/runs", {
        "assistant_id": "agent", "input": {"messages": [{"role": "user", "content": "hi"}]}})
    assert made.status_code == 200, made.text
    protocol_run = made.json()["run_id"]
    cancelled = ask(url, root, "POST", f"/threads/{thread}/runs/{protocol_run}/cancel")
    assert cancelled.status_code in (200, 202, 204), cancelled.text
    shown = run_of(url, alice, protocol_run)
    assert (shown["status"], shown["startedBy"], shown["cancelledBy"]) == ("cancelled", "alice", "root")


def test_a_decision_says_who_decided(
    sophos_env: SophosEnv, model: FakeOllama, start_worker: Callable[..., ServiceProcess],
    start_api: Callable[..., ServiceProcess],
) -> None:
    alice = add_user(sophos_env, "alice")
    root = add_user(sophos_env, "root", "--operator")
    require_approval(sophos_env, ["add"])
    model.script(ToolCalls([("tools__add", {"a": 2, "b": 3})]), Text("The sum is 5."))
    start_worker(sophos_env)
    url = start_api(sophos_env).url

    conversation = ask(url, alice, "POST", "/api/chat", {"message": "add 2 and 3"}).json()["conversation"]
    assert read_sse(url, conversation, token=alice, timeout=TIMEOUT)[-1].data["status"] == "waiting"
    [request] = ask(url, alice, "GET", f"/api/conversations/{conversation}").json()["pendingApproval"]
    # An operator decides on alice's behalf.
    decided = ask(url, root, "POST", "/api/chat", {
        "conversation": conversation, "decisions": [{"id": request["id"], "action": "approve"}]})
    assert decided.status_code == 202, decided.text
    assert read_sse(url, conversation, token=alice, timeout=TIMEOUT)[-1].data["status"] == "completed"
    assert run_of(url, alice, decided.json()["run"])["startedBy"] == "root"

    detail = ask(url, alice, "GET", f"/api/conversations/{conversation}").json()
    [call] = [c for m in detail["messages"] for c in m.get("toolCalls", [])]
    assert call["approval"] == {
        "action": "approve", "proposedArguments": {"a": 2, "b": 3}, "decidedBy": "root"}
    export = ask(url, alice, "GET", f"/api/conversations/{conversation}/export").text
    assert "*Approved by root.*" in export
