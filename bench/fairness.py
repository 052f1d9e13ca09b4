"""Figure 20: fair shares, user B's queue wait while user A has many runs queued (issue 40).

One stack (Redis, fake model, one worker at ``WORKER_CONCURRENCY`` 1, the API) with two users
made by ``sophos users add``. Each round measures B's queue wait (``waitedMs`` of
``GET /api/runs/{id}``: from acceptance to a worker's start) twice, side by side: B's one run on
an idle service, and B's one run submitted just after A queued ``queued`` runs. Round-robin
across owners (worker/queue/fair.py) should leave B behind at most the one run of A in progress; in
queue order B would wait for all of A's still queued. The figure also counts how many of A's runs
started while B's waited (acceptance to start), and A's run time, what B's wait is made of.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.client import BenchError
from bench.runs import MESSAGE
from bench.stack import running_stack
from tests.support.procs import wait_api_ready, wait_worker_ready
from tests.support.users import add_user


@dataclass(frozen=True, slots=True)
class Sizes:
    rounds: int
    queued: int


FULL = Sizes(rounds=5, queued=50)
QUICK = Sizes(rounds=1, queued=5)


@dataclass
class Fairness:
    queued: int
    rounds: int
    #: B's queue wait, ms: alone, and behind A's queued runs
    alone_ms: list[float] = field(default_factory=list)
    behind_ms: list[float] = field(default_factory=list)
    #: per round, how many of A's runs started while B's waited
    a_before_b: list[int] = field(default_factory=list)
    #: A's runs, start to end, ms
    a_run_ms: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0


def _post(http: httpx.Client, key: str) -> str:
    answer = http.post("/api/chat", json={"message": MESSAGE}, headers={"authorization": f"Bearer {key}"})
    if answer.status_code != 202:
        raise BenchError(f"POST /api/chat: {answer.status_code} {answer.text}")
    return str(answer.json()["run"])


def _ended(http: httpx.Client, key: str, run: str, timeout: float = 300.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info: dict[str, Any] = http.get(f"/api/runs/{run}", headers={"authorization": f"Bearer {key}"}).json()
        if info.get("status") not in (None, "queued", "running"):
            if info["status"] != "completed":
                raise BenchError(f"run {run} ended {info['status']}: {info.get('error')}")
            return info
        time.sleep(0.02)
    raise BenchError(f"run {run} did not end within {timeout:.0f} s")


def measure(
    *, quick: bool, overrides: Mapping[str, str] | None = None, keep: bool = False,
    say: Callable[[str], None] = lambda _: None,
) -> Fairness:
    sizes = QUICK if quick else FULL
    started = time.monotonic()
    result = Fairness(queued=sizes.queued, rounds=sizes.rounds)
    env = {**dict(overrides or {}), "USER_MAX_ACTIVE_RUNS": str(sizes.queued + 10), "WORKER_CONCURRENCY": "1"}
    with running_stack(overrides=env, keep=keep) as stack:
        a, b = add_user(stack.env, "user-a"), add_user(stack.env, "user-b")
        stack.worker = stack.procs.start_worker(stack.env, wait_ready=False)
        stack.api = stack.procs.start_api(stack.env, wait_ready=False)
        wait_worker_ready(stack.worker, stack.redis.url)
        wait_api_ready(stack.api)
        with httpx.Client(base_url=stack.api_url, timeout=30, trust_env=False) as http:
            for key in (a, b):  # warm both paths
                _ended(http, key, _post(http, key))
            for i in range(sizes.rounds):
                result.alone_ms.append(_ended(http, b, _post(http, b))["waitedMs"])
                mine = [_post(http, a) for _ in range(sizes.queued)]
                theirs = _ended(http, b, _post(http, b))
                result.behind_ms.append(theirs["waitedMs"])
                ends = [_ended(http, a, run) for run in mine]
                result.a_before_b.append(sum(
                    1 for e in ends if theirs["enqueuedAt"] < e["startedAt"] < theirs["startedAt"]
                ))
                result.a_run_ms.extend(e["durationMs"] for e in ends)
                say(f"figure 20: round {i + 1}/{sizes.rounds} done")
    result.elapsed_s = time.monotonic() - started
    return result


HEADING = "## Fair shares: a user's queue wait behind another's many runs (figure 20)"


def section(f: Fairness, *, stamp: str = "") -> str:
    alone, behind = statistics.median(f.alone_ms), statistics.median(f.behind_ms)
    run = statistics.median(f.a_run_ms)
    return (
        f"{HEADING}\n\n"
        f"One worker (`WORKER_CONCURRENCY` 1); {f.rounds} round(s), each: user B's one run on the idle "
        f"service, then user A queues {f.queued} runs and B one more. B's queue wait is the run's "
        f"`waitedMs` (acceptance to a worker's start). Took {f.elapsed_s:.0f} s.\n\n"
        + (f"{stamp.strip()}\n\n" if stamp else "")
        + "| | B's queue wait p50 ms (max) | ratio |\n|---|---:|---:|\n"
        + f"| B alone | {alone:.0f} ({max(f.alone_ms):.0f}) | 1.00× |\n"
        + f"| B behind A's {f.queued} queued runs | {behind:.0f} ({max(f.behind_ms):.0f}) | "
        + f"{behind / max(alone, 1.0):.2f}× |\n\n"
        + f"A's runs that started while B's waited: at most {max(f.a_before_b)} (a round's largest); "
        f"A's run takes {run:.0f} ms (p50), so had B waited for every run of A's "
        f"queued, it would have waited up to {f.queued} × {run:.0f} = {f.queued * run:.0f} ms.\n"
    )
