"""``python -m bench [--quick]``: run every figure, print the table, write ``bench/RESULTS.md``.

``--only ledger`` measures figure 14 (the ledger's cost) alone, in about a minute, and
replaces only its section of the results file; ``--only tracing`` does the same for
figure 15 (the cost of exporting traces), ``--only memory`` for figure 16 (the process tree's
memory), ``--only solo`` for figure 17 (one run at a time at ``WORKER_CONCURRENCY`` 1 and 4),
``--only hops`` for figure 18 (thread hops per run), ``--only switches`` for figure 12 (the
speed switches, the API's HTTP parser among them), ``--only servers`` for figure 19 (uvicorn and
Granian; needs the ``bench`` extra, and is measured only then), ``--only fairness`` for figure 20
(a user's queue wait behind another user's many queued runs), ``--only identity`` for figure 21
(what a key or an OIDC JWT costs a request against no identity), ``--only crossing`` for figure 22
(system calls, context switches and Redis commands per run, per process, against the floor),
``--only remote`` for figure 23 (a remote tool call against a stdio one), ``--only growth`` for figure 24
(a request's cost on a big store against an empty one, both engines), ``--only streams`` for
figure 26 (1,000 open streams on one API process; ``--streams N`` for another number), ``--only
retention`` for figure 27 (the retention deleting old conversations beside live runs;
``--retention-conversations N`` for another number).

Full mode takes a few minutes on a 2-core machine, one figure after another; ``--quick`` (under a
minute: 40 to 47 s on a shared 2-core machine, four figures at a time, most of it starting the
stacks of its twenty-odd figures) only checks that everything works (CI): it never judges speed,
and it writes no results file unless ``--results`` is given. The exit status is non-zero
only when the service misbehaves (a run fails, a stream breaks), never because a
target is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from bench import (
    profiling,
    servers,
    variants,
)
from bench.client import BenchError, Client, chat_once, http_client
from bench.floor import Floor, in_process_floor
from bench.phases import (
    FULL,
    HERE,
    QUICK,
    Sizes,
    crossing_phase,
    fairness_phase,
    growth_phase,
    hops_phase,
    identity_phase,
    ledger_phase,
    memory_phase,
    only,
    pruning_phase,
    remote_phase,
    retention_phase,
    say,
    servers_phase,
    solo_phase,
    streams_phase,
    tracing_phase,
)
from bench.postgres import on_postgres
from bench.report import (
    Results,
    console,
    markdown,
    raw,
)
from bench.runs import (
    MESSAGE,
    checkpointed_size,
    database_totals,
    long_conversation,
    single_runs,
    stored_messages,
    throughput,
    timelines,
    warm_up,
    worker_cycle,
)
from bench.scaling import more_runs_at_once
from bench.schedule import run_all
from bench.stack import Stack, code_version, describe_machine, load_average, rss_bytes, running_stack
from bench.storage import LARGE, Storage, exports, pages, relay_beside_exports, seed_conversations
from bench.streams import api_streams, relay
from shared.logging import configure_logging
from shared.settings import Settings


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="smoke mode: a few runs per figure (CI)")
    p.add_argument(
        "--results",
        type=Path,
        default=None,
        help="write the Markdown results here (default: bench/RESULTS.md in full mode, none in quick)",
    )
    p.add_argument("--json", type=Path, default=None, help="also write every sample as JSON here")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment for the worker and the API, e.g. POLL_DELAY=0.002 (repeatable)",
    )
    p.add_argument(
        "--profile",
        type=Path,
        default=None,
        metavar="DIR",
        help="after the figures, profile worker, API and floor with py-spy; write stacks to DIR",
    )
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (logs, databases)")
    p.add_argument("--seed", type=int, default=6, help="seed of the interleaving order")
    p.add_argument(
        "--only",
        choices=["ledger", "tracing", "memory", "solo", "hops", "switches", "servers", "fairness",
                 "identity", "crossing", "remote", "growth", "pruning", "retention", "streams",
                 "postgres"],
        default=None,
        help="measure one figure alone (ledger: figure 14; tracing: figure 15; memory: figure 16; "
        "solo: figure 17; hops: figure 18; switches: figure 12; servers: figure 19; fairness: figure 20; "
        "identity: figure 21; crossing: figure 22; remote: figure 23; growth: figure 24; pruning: figure 25; "
        "streams: figure 26; retention: figure 27; postgres: figure 13) "
        "and replace only "
        "its section of the results",
    )
    p.add_argument(
        "--growth-conversations", type=int, default=None,
        help="conversations in figure 24's big store (default 100,000; 50 with --quick)",
    )
    p.add_argument(
        "--growth-export-messages", type=int, default=None,
        help="stored messages of figure 24's exported conversation (default 5,000; 20 with --quick)",
    )
    p.add_argument(
        "--retention-conversations", type=int, default=None,
        help="old conversations figure 27's retention deletes beside live runs (default 1000; 10 quick)",
    )
    p.add_argument("--ledger-runs", type=int, default=None, help="override the runs of each arm of figure 14")
    for name in ("single", "rounds", "round-runs", "clients", "messages", "relay", "streams"):
        p.add_argument(
            f"--{name}", type=int, default=None, help=f"override the number of {name.replace('-', ' ')}"
        )
    return p.parse_args(argv)


async def measure(stack: Stack, sizes: Sizes, args: argparse.Namespace) -> Results:
    rng = random.Random(args.seed)
    started = time.monotonic()
    worker, api = stack.start()
    say(f"worker pid {worker.pid}, API pid {api.pid} at {stack.api_url}; data in {stack.root}")
    floor_db = stack.root / "floor" / "floor.db"
    floor_settings = Settings.from_env(stack.settings_env(DATABASE_PATH=str(floor_db)))
    redis = Redis.from_url(stack.redis.url, decode_responses=True)
    profiles: list[tuple[str, Path]] = []
    try:
        async with (
            in_process_floor(floor_settings, dict(stack.env)) as floor,
            http_client(stack.api_url, connections=2 * sizes.clients + 8) as http,
        ):
            say(f"warm-up: {sizes.warm} runs each")
            await warm_up(http, floor, sizes.warm)

            say(f"figure 1: {sizes.single} runs each, service and floor interleaved")
            single = await single_runs(http, floor, sizes.single, rng, cpu=stack.cpu_snapshot)

            say(f"figure 4: {sizes.rounds} round(s) of {sizes.round_runs} runs, {sizes.clients} clients")
            load = await throughput(
                http,
                floor,
                rounds=sizes.rounds,
                runs=sizes.round_runs,
                clients=sizes.clients,
                rng=rng,
                cpu=stack.cpu_snapshot,
            )

            say(f"figure 5: {sizes.messages} messages on one conversation (and one floor thread)")
            service_before = checkpointed_size(stack.database_path).file_bytes
            floor_before = checkpointed_size(floor_db).file_bytes
            long, conversation, _thread = await long_conversation(http, floor, sizes.messages, rng)
            service_after = checkpointed_size(stack.database_path, conversation)
            floor_after = checkpointed_size(floor_db).file_bytes

            records = stack.worker_records()
            tl_single = await timelines(redis, stack.database_path, records, single.service)
            tl_long = await timelines(redis, stack.database_path, records, long.service)
            cycle = worker_cycle(records, load.service_runs)
            worker_rss, worker_hwm = rss_bytes(worker.pid)
            mcp_rss = sum(rss_bytes(pid)[0] for pid in worker.descendants())

            if args.profile is not None:
                profiles = await profile_phase(stack, http, floor, sizes, args.profile)

        say("stopping the worker (figures 3 and 6 need runs that stay queued)")
        stack.stop_worker()
        total_bytes, total_conversations, total_messages = database_totals(stack.database_path)

        async with http_client(stack.api_url) as http:
            say(f"figure 3: {sizes.relay} events relayed")
            relayed = await relay(http, redis, sizes.relay, rng, cpu=stack.cpu_snapshot)
            stored = stored_messages(stack.database_path, conversation)
            storage = Storage(messages=stored)
            n_exports = 3 if args.quick else 10
            say(f"figure 8: {n_exports} Markdown and JSON Lines exports of the {stored}-message conversation")
            await exports(stack.api_url, conversation, n_exports, storage)
            say(f"figure 9: {sizes.relay // 2} events relayed each idle and beside that export in a loop")
            await relay_beside_exports(
                stack.api_url, http, redis, conversation, sizes.relay // 2, rng, storage
            )
        large = 2_000 if args.quick else LARGE
        storage.page_small = seed_conversations(stack.database_path, 0)
        say(f"figure 10: a page of conversations at {storage.page_small} and at {large}")
        storage.page_small_ms = await pages(stack.api_url, 20)
        storage.page_large = seed_conversations(stack.database_path, large)
        storage.page_large_ms = await pages(stack.api_url, 20)
        say(f"figure 6: API holding {sizes.streams} streams")
        streams = await api_streams(stack.api_url, api.pid, redis, sizes.streams)
    finally:
        await redis.aclose()

    return Results(
        quick=args.quick,
        command="",
        date="",
        machine=describe_machine(),
        overrides=stack.extra,
        single=single,
        timelines=tl_single,
        waits=tl_single + tl_long,
        throughput=load,
        cycle=cycle,
        long=long,
        window=sizes.window,
        db={
            "user_messages": len(long.service),
            "stored_messages": stored_messages(stack.database_path, conversation),
            "service_delta": service_after.file_bytes - service_before,
            "service_payload": service_after.thread_payload_bytes,
            "floor_delta": floor_after - floor_before,
            "total_bytes": total_bytes,
            "total_conversations": total_conversations,
            "total_messages": total_messages,
        },
        worker_rss=worker_rss,
        worker_hwm=worker_hwm,
        mcp_rss=mcp_rss,
        relay=relayed,
        api=streams,
        storage=storage,
        profiles=profiles,
        elapsed_s=time.monotonic() - started,
    )


async def profile_phase(
    stack: Stack, http: Client, floor: Floor, sizes: Sizes, out: Path
) -> list[tuple[str, Path]]:
    assert stack.worker is not None and stack.api is not None
    n = sizes.profile_runs
    say(f"profile: {n} sequential service runs (worker, API), {n} floor runs, one loaded round (worker)")
    recorders = [
        profiling.Recorder(stack.worker.pid, out / "worker-single.txt"),
        profiling.Recorder(stack.api.pid, out / "api-single.txt"),
    ]
    await asyncio.sleep(1.0)  # py-spy attached
    for _ in range(n):
        await chat_once(http, MESSAGE)
    paths = [r.stop() for r in recorders]
    own = profiling.Recorder(os.getpid(), out / "floor.txt")
    await asyncio.sleep(1.0)
    for _ in range(n):
        await floor.run(str(uuid.uuid4()), MESSAGE)
    paths.append(own.stop())
    loaded = profiling.Recorder(stack.worker.pid, out / "worker-load.txt")
    await asyncio.sleep(1.0)
    await throughput(
        http, floor, rounds=1, runs=sizes.round_runs, clients=sizes.clients, rng=random.Random(0)
    )
    paths.append(loaded.stop())
    titles = [
        "worker, one run at a time",
        "API, one run at a time",
        "floor (benchmark process)",
        f"worker, {sizes.clients} concurrent clients (and the floor's sequential round)",
    ]
    return list(zip(titles, paths, strict=True))


#: figures measured at once in the smoke mode (bench/schedule.py): on the shared 2-core machine, one
#: run after another, 4 took 40 s, 3 took 46 s, 2 took 57 s (it is CPU-bound by then: the stacks' starts)
QUICK_LANES = 4
#: the figures that spend most of the smoke mode waiting (on the sweep's next pass, idle spells, a
#: fake model that takes its time): started first, so that the others use the cores meanwhile
QUICK_FIRST = ("27", "16", "11", "13")


@dataclass(frozen=True, slots=True)
class Figure:
    """One figure of figures 11 to 27, measured: a field of :class:`Results`, or a section."""

    elapsed_s: float
    field: str = ""
    value: object = None
    section: str = ""

    def add_to(self, results: Results) -> None:
        if self.field:
            setattr(results, self.field, self.value)
        if self.section:
            results.sections.append(self.section)
        results.elapsed_s += self.elapsed_s


def first_stack(sizes: Sizes, args: argparse.Namespace, overrides: dict[str, str]) -> Results:
    """Figures 1 to 10, on one stack."""
    with running_stack(overrides=overrides, keep=args.keep) as stack:
        return asyncio.run(measure(stack, sizes, args))


def later_figures(
    sizes: Sizes, args: argparse.Namespace, overrides: dict[str, str], command: str
) -> dict[str, Callable[[], Figure]]:
    """Figures 11 to 27 by number, each on stacks of its own or in this process, in the full mode's
    order."""

    def scaling() -> Figure:
        say("figure 11: more runs at once, a stack of its own with a slow model")
        result = more_runs_at_once(quick=args.quick, overrides=overrides, keep=args.keep, say=say)
        return Figure(result.elapsed_s, "scaling", result)

    def switches() -> Figure:
        say("figure 12: the speed switches, a stack per variant")
        result = variants.measure(
            quick=args.quick, clients=sizes.clients, rng=random.Random(args.seed), overrides=overrides,
            keep=args.keep, say=say,
        )
        return Figure(result.elapsed_s, "switches", result)

    def postgres() -> Figure:
        say("figure 13: PostgreSQL, stacks of their own")
        result = on_postgres(
            quick=args.quick, rng=random.Random(args.seed), single=sizes.single, overrides=overrides,
            keep=args.keep, say=say,
        )
        return Figure(result.elapsed_s, "postgres", result)

    def ledger_figure() -> Figure:
        result = ledger_phase(args, overrides, command)
        return Figure(result.elapsed_s, "ledger", result)

    def tracing_figure() -> Figure:
        result = tracing_phase(args, overrides, command)
        return Figure(result.elapsed_s, "tracing", result)

    def memory_figure() -> Figure:
        say("figure 16: the process tree's memory, a stack of its own")
        result = memory_phase(args, overrides, command)
        return Figure(result.elapsed_s, "memory", result)

    def section(phase: Callable[[], tuple[Any, str]], saying: str = "") -> Callable[[], Figure]:
        def figure() -> Figure:
            if saying:
                say(saying)
            result, text = phase()
            return Figure(result.elapsed_s, section=text)

        return figure

    def servers_figure() -> Figure:
        if not servers.available():
            return Figure(0.0, section=servers.not_measured())
        return section(lambda: servers_phase(args, overrides, command),
                       "figure 19: the API under uvicorn and under Granian, stacks of their own")()

    return {
        "11": scaling, "12": switches, "13": postgres, "14": ledger_figure, "15": tracing_figure,
        "16": memory_figure,
        "17": section(lambda: solo_phase(args, overrides, command),
                      "figure 17: one run at a time at WORKER_CONCURRENCY 1 and 4, stacks of their own"),
        "18": section(lambda: hops_phase(args, command),
                      "figure 18: thread hops per run, counted in process"),
        "19": servers_figure,
        "20": section(lambda: fairness_phase(args, overrides, command)),
        "21": section(lambda: identity_phase(args, overrides, command)),
        "22": section(lambda: crossing_phase(args, overrides, command)),
        "23": section(lambda: remote_phase(args, command)),
        "24": section(lambda: growth_phase(args, overrides, command)),
        "25": section(lambda: pruning_phase(args, command)),
        "27": section(lambda: retention_phase(args, command)),
        "26": section(lambda: streams_phase(args, command)),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    base = QUICK if args.quick else FULL
    sizes = Sizes(
        warm=base.warm,
        single=args.single or base.single,
        rounds=args.rounds or base.rounds,
        round_runs=args.round_runs or base.round_runs,
        clients=args.clients or base.clients,
        messages=args.messages or base.messages,
        relay=args.relay or base.relay,
        streams=args.streams or base.streams,
        profile_runs=base.profile_runs,
    )
    overrides = dict(item.split("=", 1) for item in args.env)
    # The floor's MCP toolbox logs through structlog: keep the benchmark's output to its own lines.
    configure_logging("console", level=logging.WARNING)
    command = " ".join(
        [".venv/bin/python -m bench", *map(shlex.quote, sys.argv[1:] if argv is None else argv)]
    )
    if args.only is not None:
        return only(args, overrides, command)
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    load_start = load_average()
    started = time.monotonic()
    # Profiles sample the processes of one figure at a time: with --profile, one after another.
    lanes = QUICK_LANES if args.quick and args.profile is None else 1
    figures = later_figures(sizes, args, overrides, command)
    names = ["1-10", *figures]
    try:
        results, *later = run_all([lambda: first_stack(sizes, args, overrides), *figures.values()],
                                  lanes=lanes, first=[names.index(name) for name in QUICK_FIRST])
    except BenchError as exc:
        say(f"FAILED: {exc}")
        return 1
    assert isinstance(results, Results)
    for figure in later:
        assert isinstance(figure, Figure)
        figure.add_to(results)
    if lanes > 1:  # the figures overlapped: their times add up to more than it took
        results.elapsed_s = time.monotonic() - started
    results.command = command
    results.load_start, results.load_end, results.code = load_start, load_average(), code_version()
    results.date = subprocess.run(["date", "-u"], capture_output=True, text=True).stdout.strip()
    print(console(results))
    target = args.results if args.results is not None else (None if args.quick else HERE / "RESULTS.md")
    if target is not None:
        target.write_text(markdown(results))
        say(f"results written to {target}")
    if args.json is not None:
        args.json.write_text(json.dumps(raw(results), indent=1))
    say(f"done in {results.elapsed_s:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
