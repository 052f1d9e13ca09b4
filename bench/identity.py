"""Figure 21: what knowing the caller costs a request: no identity, a user's key, an OIDC JWT
(issue 40).

Two API processes on one Redis (no worker: the route measured, ``GET /api/whoami``, is the
guard and little else): one with no identity configured (the local user, the database asked
at most every half second whether keys are in force), one whose database has a user made by
``sophos users add`` and whose ``AUTH_OIDC_ISSUER`` is a loopback issuer (tests/support/oidc.py)
signing RS256 tokens. Each round sends ``requests`` requests one at a time per way, the ways in a
fresh random order, so drift on this shared machine falls on all alike. Per way: the latency at the
client and the serving API's CPU per request (``/proc``, 10 ms ticks, summed over the round).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import httpx

from bench.client import BenchError
from bench.stack import cpu_seconds, running_stack
from tests.support.oidc import Issuer
from tests.support.ports import free_port
from tests.support.procs import ServiceProcess, wait_api_ready
from tests.support.users import add_user, users


@dataclass(frozen=True, slots=True)
class Sizes:
    warm: int
    rounds: int
    requests: int


FULL = Sizes(warm=200, rounds=10, requests=300)
QUICK = Sizes(warm=5, rounds=1, requests=10)
WAYS = ("none", "key", "jwt")


@dataclass
class Way:
    name: str
    latency_ms: list[float] = field(default_factory=list)
    #: API CPU ms per request, per round
    cpu_ms: list[float] = field(default_factory=list)


@dataclass
class Identity:
    ways: list[Way]
    rounds: int
    requests: int
    elapsed_s: float = 0.0


def _round(http: httpx.Client, api: ServiceProcess, credential: str | None, way: Way, n: int) -> None:
    headers = {"authorization": f"Bearer {credential}"} if credential else {}
    before = cpu_seconds(api.pid)
    for _ in range(n):
        started = time.perf_counter()
        answer = http.get("/api/whoami", headers=headers)
        way.latency_ms.append((time.perf_counter() - started) * 1000)
        if answer.status_code != 200:
            raise BenchError(f"GET /api/whoami ({way.name}): {answer.status_code} {answer.text}")
    way.cpu_ms.append((cpu_seconds(api.pid) - before) * 1000 / n)


def measure(
    *, quick: bool, rng: random.Random, overrides: Mapping[str, str] | None = None, keep: bool = False,
    say: Callable[[str], None] = lambda _: None,
) -> Identity:
    sizes = QUICK if quick else FULL
    started = time.monotonic()
    ways = {name: Way(name) for name in WAYS}
    with running_stack(overrides=overrides, keep=keep) as stack, Issuer(audience="sophos") as issuer:
        plain = stack.env.with_(API_PORT=free_port(), DATABASE_PATH=str(stack.root / "plain.db"))
        made = users(plain, "list")  # creates and migrates the database, with no user in it
        if made.returncode != 0:
            raise BenchError(f"sophos users list: {made.stderr}")
        known = stack.env.with_(
            API_PORT=free_port(), DATABASE_PATH=str(stack.root / "known.db"),
            AUTH_OIDC_ISSUER=issuer.url, AUTH_OIDC_AUDIENCE="sophos",
        )
        key = add_user(known, "bench")
        token = issuer.token("bench-oidc")
        apis = {"none": stack.procs.start_api(plain, wait_ready=False)}
        apis["key"] = apis["jwt"] = stack.procs.start_api(known, wait_ready=False)
        for api in {id(a): a for a in apis.values()}.values():
            wait_api_ready(api)
        credentials = {"none": None, "key": key, "jwt": token}
        clients = {
            name: httpx.Client(base_url=str(apis[name].url), timeout=30, trust_env=False) for name in WAYS
        }
        try:
            for name in WAYS:
                _round(clients[name], apis[name], credentials[name], Way(name), sizes.warm)
            for i in range(sizes.rounds):
                order = list(WAYS)
                rng.shuffle(order)
                for name in order:
                    _round(clients[name], apis[name], credentials[name], ways[name], sizes.requests)
                say(f"figure 21: round {i + 1}/{sizes.rounds} done")
        finally:
            for client in clients.values():
                client.close()
    elapsed = time.monotonic() - started
    return Identity([ways[n] for n in WAYS], sizes.rounds, sizes.requests, elapsed_s=elapsed)


HEADING = "## What knowing the caller costs a request (figure 21)"
_WHAT = {
    "none": "no identity (the local user)",
    "key": "a user's key (`sophos users add`)",
    "jwt": "an OIDC JWT (RS256, verified by PyJWT)",
}


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}×" if base > 0 else "n/a"  # the smoke run's few requests: no CPU tick yet


def section(result: Identity, *, stamp: str = "") -> str:
    base = result.ways[0]
    base50, base_cpu = statistics.median(base.latency_ms), statistics.median(base.cpu_ms)
    rows = []
    for way in result.ways:
        p50, cpu = statistics.median(way.latency_ms), statistics.median(way.cpu_ms)
        rows.append(
            f"| {_WHAT[way.name]} | {p50:.2f} | {_ratio(p50, base50)} | {cpu:.2f} | {_ratio(cpu, base_cpu)} |"
        )
    return (
        f"{HEADING}\n\n"
        f"`GET /api/whoami` (the guard and little else), one request at a time, {result.rounds} round(s) of "
        f"{result.requests} requests per way, the ways in a random order each round; the API's CPU from "
        f"`/proc` summed over a round. Took {result.elapsed_s:.0f} s.\n\n"
        + (f"{stamp.strip()}\n\n" if stamp else "")
        + "| the caller presents | latency p50 ms | ratio | API CPU ms per request (median round) | ratio |\n"
        + "|---|---:|---:|---:|---:|\n" + "\n".join(rows) + "\n"
    )
