"""Fair shares (DESIGN.md "People and what they may touch"): a user's limit of active runs, and
queued runs taken round-robin across users.

Real processes: users made by ``sophos users``, a real worker (two on PostgreSQL) and API, the
fake model holding a run open so that others queue behind it.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from tests.fakes.ollama import FakeOllama, Hang, ToolCalls
from tests.support.client import chat, get_json, post_chat, read_sse, wait_for
from tests.support.env import SophosEnv, require_approval
from tests.support.procs import ServiceProcess
from tests.support.users import add_user


def _refused_for_quota(response: httpx.Response, limit: int) -> None:
    assert response.status_code == 429, response.text
    error = response.json()["error"]
    assert error["code"] == "TOO_MANY_ACTIVE_RUNS"
    assert f"USER_MAX_ACTIVE_RUNS={limit}" in error["message"]
    assert response.headers["retry-after"] == "5"


def _active(api: str, token: str) -> list[str]:
    runs = get_json(api, "/api/runs", token=token)["runs"]
    return [r["id"] for r in runs if r["status"] in ("queued", "running")]


def test_a_user_at_the_limit_gets_429_and_nobody_else_is_held(
    sophos_env: SophosEnv, model: FakeOllama,
    start_worker: Callable[..., ServiceProcess], start_api: Callable[..., ServiceProcess],
) -> None:
    env = sophos_env.with_(USER_MAX_ACTIVE_RUNS=2)
    require_approval(env, ["add"])
    alice, bob = add_user(env, "alice"), add_user(env, "bob")
    root = add_user(env, "root", "--operator")
    first, later = Hang(), Hang()
    model.script_for("alice-1", first).script_for("alice-4", later)
    model.script_for("alice-tool", ToolCalls([("tools__add", {"a": 2, "b": 3})]))
    start_worker(env)
    api = start_api(env).url

    _, run = chat(api, "alice-1", token=alice)
    first.wait_started()
    queued_conversation, queued = chat(api, "alice-2", token=alice)  # queued behind (one worker)
    _refused_for_quota(post_chat(api, "alice-3", token=alice), 2)
    # The refusal recorded nothing: alice's runs are the two accepted.
    mine = get_json(api, "/api/runs", token=alice)["runs"]
    assert sorted(r["id"] for r in mine) == sorted([run, queued])
    # Another user's share is their own; an operator's runs are counted, never limited.
    chat(api, "bob-1", token=bob)
    for n in range(3):
        chat(api, f"root-{n}", token=root)

    first.release()
    done = read_sse(api, queued_conversation, token=alice).terminal
    assert done is not None and done.data["status"] == "completed"
    chat(api, "alice-3", token=alice)  # her runs ended: room again

    # A conversation waiting for a decision holds no run.
    waiting_conversation, _ = chat(api, "alice-tool", token=alice)
    ending = read_sse(api, waiting_conversation, token=alice).terminal
    assert ending is not None and ending.data["status"] == "waiting"
    wait_for(lambda: not _active(api, alice), message="alice-3 ended")
    chat(api, "alice-4", token=alice)
    later.wait_started()
    chat(api, "alice-5", token=alice)  # queued behind it
    assert len(_active(api, alice)) == 2
    _refused_for_quota(post_chat(api, "alice-6", token=alice), 2)
    later.release()


@pytest.mark.backends
def test_queued_runs_are_taken_round_robin_across_users(
    sophos_env: SophosEnv, model: FakeOllama, backend: str,
    start_worker: Callable[..., ServiceProcess], start_api: Callable[..., ServiceProcess],
) -> None:
    """alice queues many runs while every worker is busy with hers; bob's and carol's, queued
    after all of hers, each wait behind at most one of hers (SQLite: one worker; PostgreSQL: two)."""
    workers = 2 if backend == "postgresql" else 1
    env = sophos_env.with_(USER_MAX_ACTIVE_RUNS=20)
    alice, bob, carol = (add_user(env, name) for name in ("alice", "bob", "carol"))
    holds = [Hang() for _ in range(workers)]
    for n, hold in enumerate(holds):
        model.script_for(f"alice-busy-{n}", hold)
    for _ in range(workers):
        start_worker(env)
    api = start_api(env).url

    for n, hold in enumerate(holds):
        chat(api, f"alice-busy-{n}", token=alice)
        hold.wait_started()
    queued = [f"alice-queued-{n}" for n in range(8)]
    for message in queued:
        chat(api, message, token=alice)
    chat(api, "bob-queued", token=bob)
    chat(api, "carol-queued", token=carol)
    for hold in holds:
        hold.release()

    def started() -> list[str]:
        order: list[str] = []
        for request in model.requests:
            asked = next(m["content"] for m in request["messages"] if m["role"] == "user")
            if asked not in order:
                order.append(asked)
        return order

    every = workers + len(queued) + 2
    order = wait_for(lambda: o if len(o := started()) == every else None,
                     timeout=60, message="every run asked the model")
    print("order taken:", order)
    for late in ("bob-queued", "carol-queued"):
        ahead = order[:order.index(late)]
        assert sum(m in queued for m in ahead) <= 1, order
    assert order.index("bob-queued") < order.index("alice-queued-2")
