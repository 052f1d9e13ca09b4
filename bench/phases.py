"""The benchmark's sizes and its figures measured one at a time (``--only FIGURE``), each as a phase:
what ``python -m bench`` runs for a figure, written to its section of the results (bench/__main__.py
runs them all)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench import (
    crossing,
    fairness,
    growth,
    hops,
    identity,
    ledger,
    memory,
    openstreams,
    pruning,
    remote,
    retention,
    servers,
    solo,
    tracing,
    variants,
)
from bench.client import BenchError
from bench.postgres import Postgres, on_postgres
from bench.report import (
    LEDGER_HEADING,
    POSTGRES_HEADING,
    ledger_section,
    postgres_section,
    splice_section,
)
from bench.stack import code_version, load_average

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True, slots=True)
class Sizes:
    warm: int
    single: int
    rounds: int
    round_runs: int
    clients: int
    messages: int
    relay: int
    streams: int
    profile_runs: int

    @property
    def window(self) -> int:
        return max(1, min(10, self.messages // 4))


FULL = Sizes(
    warm=5,
    single=100,
    rounds=5,
    round_runs=64,
    clients=16,
    messages=100,
    relay=400,
    streams=200,
    profile_runs=60,
)
QUICK = Sizes(
    warm=2, single=5, rounds=1, round_runs=16, clients=16, messages=8, relay=20, streams=200, profile_runs=5
)


def say(text: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def ledger_phase(args: argparse.Namespace, overrides: dict[str, str], command: str) -> ledger.LedgerCost:
    """Figure 14, stamped with how it was measured (its section says so, alone or not)."""
    load_start = load_average()
    cost = ledger.measure(
        quick=args.quick, rng=random.Random(args.seed), overrides=overrides, keep=args.keep,
        runs=args.ledger_runs, say=say,
    )
    cost.command, cost.code = command, code_version()
    cost.load = f"{load_start}; {load_average()}"
    cost.date = subprocess.run(["date", "-u"], capture_output=True, text=True).stdout.strip()
    return cost


def tracing_phase(args: argparse.Namespace, overrides: dict[str, str], command: str) -> tracing.TracingCost:
    """Figure 15, stamped with how it was measured."""
    load_start = load_average()
    cost = tracing.measure(
        quick=args.quick, rng=random.Random(args.seed), overrides=overrides, keep=args.keep, say=say,
    )
    cost.command, cost.code = command, code_version()
    cost.load = f"{load_start}; {load_average()}"
    cost.date = subprocess.run(["date", "-u"], capture_output=True, text=True).stdout.strip()
    return cost


def memory_phase(args: argparse.Namespace, overrides: dict[str, str], command: str) -> memory.Memory:
    """Figure 16, stamped with how it was measured."""
    load_start = load_average()
    result = memory.measure(quick=args.quick, overrides=overrides, keep=args.keep, say=say)
    result.command, result.code = command, code_version()
    result.load = f"{load_start}; {load_average()}"
    result.date = subprocess.run(["date", "-u"], capture_output=True, text=True).stdout.strip()
    return result


def solo_phase(args: argparse.Namespace, overrides: dict[str, str], command: str) -> tuple[solo.Solo, str]:
    """Figure 17 and its section, stamped with how it was measured."""
    load_start = load_average()
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    result = solo.measure(quick=args.quick, rng=random.Random(args.seed), overrides=overrides, keep=args.keep,
                          profile=args.profile if args.only == "solo" else None, say=say)
    date = subprocess.run(["date", "-u"], capture_output=True, text=True).stdout.strip()
    text = solo.section(result, command=command, code=code_version(), date=date,
                        load=f"{load_start}; {load_average()}")
    return result, text


def fairness_phase(
    args: argparse.Namespace, overrides: dict[str, str], command: str
) -> tuple[fairness.Fairness, str]:
    """Figure 20 and its section, stamped with how it was measured."""
    load_start = load_average()
    say("figure 20: fair shares, a stack of its own with two users")
    result = fairness.measure(quick=args.quick, overrides=overrides, keep=args.keep, say=say)
    return result, fairness.section(result, stamp=_stamp(command, load_start))


def identity_phase(
    args: argparse.Namespace, overrides: dict[str, str], command: str
) -> tuple[identity.Identity, str]:
    """Figure 21 and its section, stamped with how it was measured."""
    load_start = load_average()
    say("figure 21: what knowing the caller costs a request, two APIs of their own")
    result = identity.measure(quick=args.quick, rng=random.Random(args.seed), overrides=overrides,
                              keep=args.keep, say=say)
    return result, identity.section(result, stamp=_stamp(command, load_start))


def crossing_phase(
    args: argparse.Namespace, overrides: dict[str, str], command: str
) -> tuple[crossing.Crossing, str]:
    """Figure 22 and its section, stamped with how it was measured."""
    load_start = load_average()
    say("figure 22: the crossing, a stack of its own and the floor, counted per process")
    result = crossing.measure(quick=args.quick, overrides=overrides, keep=args.keep, say=say)
    return result, crossing.section(result, stamp=_stamp(command, load_start))


def growth_phase(
    args: argparse.Namespace, overrides: dict[str, str], command: str
) -> tuple[growth.Growth, str]:
    """Figure 24 and its section, stamped with how it was measured."""
    load_start = load_average()
    say("figure 24: a request's cost on a big store against an empty one, stacks of their own")
    result = growth.measure(quick=args.quick, rng=random.Random(args.seed), keep=args.keep,
                            conversations=args.growth_conversations,
                            export_messages=args.growth_export_messages, say=say)
    return result, growth.section(result, stamp=_stamp(command, load_start))


def streams_phase(args: argparse.Namespace, command: str) -> tuple[openstreams.OpenStreams, str]:
    """Figure 26 and its section, stamped with how it was measured."""
    load_start = load_average()
    n = args.streams or (openstreams.QUICK_STREAMS if args.quick else openstreams.FULL_STREAMS)
    result = openstreams.measure(streams=n, strict=args.quick, keep=args.keep, say=say)
    result.command, result.code = command, code_version()
    result.load = f"{load_start}; {load_average()}"
    result.date = subprocess.run(["date", "-u"], capture_output=True, text=True).stdout.strip()
    return result, openstreams.section(result)


def pruning_phase(args: argparse.Namespace, command: str) -> tuple[pruning.Pruning, str]:
    """Figure 25 and its section, stamped with how it was measured."""
    load_start = load_average()
    result = pruning.measure(quick=args.quick, say=say)
    return result, pruning.section(result, stamp=_stamp(command, load_start))


def retention_phase(args: argparse.Namespace, command: str) -> tuple[retention.Retention, str]:
    """Figure 27 and its section, stamped with how it was measured."""
    load_start = load_average()
    result = retention.measure(quick=args.quick, keep=args.keep, conversations=args.retention_conversations,
                               say=say)
    return result, retention.section(result, stamp=_stamp(command, load_start))


def _stamp(command: str, load_start: str) -> str:
    """How a figure measured alone was measured: command, date, code, load (its section's first line)."""
    date = subprocess.run(["date", "-u"], capture_output=True, text=True).stdout.strip()
    return (f"Measured by `{command}` on {date} (code {code_version()}; load average at start, at end: "
            f"{load_start}; {load_average()}).\n\n")


def switches_phase(
    args: argparse.Namespace, overrides: dict[str, str], command: str
) -> tuple[variants.Switches, str]:
    """Figure 12 alone and its section, stamped with how it was measured."""
    load_start = load_average()
    result = variants.measure(
        quick=args.quick, clients=args.clients or 16, rng=random.Random(args.seed), overrides=overrides,
        keep=args.keep, say=say,
    )
    return result, f"{variants.HEADING}\n\n{_stamp(command, load_start)}{variants.section(result)}"


def servers_phase(
    args: argparse.Namespace, overrides: dict[str, str], command: str
) -> tuple[servers.Servers, str]:
    """Figure 19 alone and its section, stamped with how it was measured."""
    load_start = load_average()
    result = servers.measure(
        quick=args.quick, clients=args.clients or 16, rng=random.Random(args.seed), overrides=overrides,
        keep=args.keep, say=say,
    )
    return result, servers.section(result, stamp=_stamp(command, load_start))


def remote_phase(args: argparse.Namespace, command: str) -> tuple[remote.RemoteCost, str]:
    """Figure 23 and its section, stamped with how it was measured."""
    load_start = load_average()
    result = remote.measure(quick=args.quick, rng=random.Random(args.seed), say=say)
    result.command, result.code = command, code_version()
    result.load = f"{load_start}; {load_average()}"
    result.date = subprocess.run(["date", "-u"], capture_output=True, text=True).stdout.strip()
    return result, remote.section(result)


def hops_phase(args: argparse.Namespace, command: str) -> tuple[hops.Hops, str]:
    """Figure 18 and its section, stamped with how it was measured."""
    result = hops.measure(quick=args.quick)
    date = subprocess.run(["date", "-u"], capture_output=True, text=True).stdout.strip()
    return result, hops.section(result, command=command, code=code_version(), date=date)


def only(args: argparse.Namespace, overrides: dict[str, str], command: str) -> int:
    """``--only FIGURE``: one figure alone; its section replaces the one in
    the results file."""
    measured: (
        ledger.LedgerCost | tracing.TracingCost | memory.Memory | solo.Solo | hops.Hops | variants.Switches
        | servers.Servers | fairness.Fairness | identity.Identity | crossing.Crossing | remote.RemoteCost
        | growth.Growth | pruning.Pruning | retention.Retention | openstreams.OpenStreams | Postgres
    )
    try:
        if args.only == "postgres":
            load_start = load_average()
            sizes = QUICK if args.quick else FULL
            measured = pg = on_postgres(
                quick=args.quick, rng=random.Random(args.seed), single=args.single or sizes.single,
                overrides=overrides, keep=args.keep, say=say,
            )
            heading = POSTGRES_HEADING
            section = f"{heading}\n\n{_stamp(command, load_start)}{postgres_section(pg)}"
        elif args.only == "ledger":
            measured = cost = ledger_phase(args, overrides, command)
            heading, section = LEDGER_HEADING, ledger_section(cost)
        elif args.only == "tracing":
            measured = traced = tracing_phase(args, overrides, command)
            heading, section = tracing.HEADING, tracing.section(traced)
        elif args.only == "memory":
            measured = tree = memory_phase(args, overrides, command)
            heading, section = memory.HEADING, memory.section(tree)
        elif args.only == "solo":
            measured, section = solo_phase(args, overrides, command)
            heading = solo.HEADING
        elif args.only == "switches":
            measured, section = switches_phase(args, overrides, command)
            heading = variants.HEADING
        elif args.only == "servers":
            measured, section = servers_phase(args, overrides, command)
            heading = servers.HEADING
        elif args.only == "fairness":
            measured, section = fairness_phase(args, overrides, command)
            heading = fairness.HEADING
        elif args.only == "identity":
            measured, section = identity_phase(args, overrides, command)
            heading = identity.HEADING
        elif args.only == "crossing":
            measured, section = crossing_phase(args, overrides, command)
            heading = crossing.HEADING
        elif args.only == "remote":
            measured, section = remote_phase(args, command)
            heading = remote.HEADING
        elif args.only == "growth":
            measured, section = growth_phase(args, overrides, command)
            heading = growth.HEADING
        elif args.only == "streams":
            measured, section = streams_phase(args, command)
            heading = openstreams.HEADING
        elif args.only == "pruning":
            measured, section = pruning_phase(args, command)
            heading = pruning.HEADING
        elif args.only == "retention":
            measured, section = retention_phase(args, command)
            heading = retention.HEADING
        else:
            measured, section = hops_phase(args, command)
            heading = hops.HEADING
    except BenchError as exc:
        say(f"FAILED: {exc}")
        return 1
    print(section)
    target = args.results if args.results is not None else (None if args.quick else HERE / "RESULTS.md")
    if target is not None:
        before = target.read_text() if target.exists() else ""
        target.write_text(splice_section(before, heading, section))
        say(f"{args.only} written to {target} (its section only)")
    if args.json is not None:
        args.json.write_text(json.dumps(dataclasses.asdict(measured), indent=1))
    say(f"done in {measured.elapsed_s:.0f} s")
    return 0
