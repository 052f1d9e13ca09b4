"""Figure 24: what a request costs as the store grows (issue 44, DESIGN.md "Growing with the work").

For each engine (SQLite, and PostgreSQL when one answers), one stack of its own (Redis, fake
model, one worker, the API) measured twice: on its empty database, then (worker and API stopped)
filled with ``conversations`` conversations of ten stored messages by bench/bigstore.py (the
worker's rows, a thread's checkpoints) and started again. Each time a few real runs make the
conversation the reads look at; then the read routes (a page of conversations, a title search,
a detail, a page of the runs view, a ``/metrics`` scrape) are timed in rounds, in a fresh random
order each round, and a run's POST -> ``end``; the ratio is the big store's p50 over the empty one's.

On each engine also: the JSON Lines export of conversations of up to ``export_messages`` stored
messages (written with the fill by bigstore's template), through the API and read both ways in
this process; and ``queued`` runs submitted with the worker stopped, by the API's own submit
script, and with them queued a page of ``/api/runs`` and a ``/metrics`` scrape. On SQLite the
longest export's time and the API process's RSS before and peak (``VmHWM``) after, and Redis's
bytes (the same on either engine): per finished run's event stream (``MEMORY USAGE``), what Redis
keeps of a conversation once its runs ended (every key naming it or its run), and per queued run
(``used_memory`` over the ``queued`` runs).
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import httpx
import redis as redis_sync
from redis.asyncio import Redis

from bench import bigstore
from bench.client import BenchError, chat_once, http_client
from bench.runs import MESSAGE
from bench.stack import Stack, running_stack
from shared.contracts.jobs import JobKind, RunJob
from shared.redis.queue import submit_run
from tests.support.postgres import PostgresServer

ROUTES = ("page", "search", "search_rare", "detail", "runs", "metrics")


@dataclass(frozen=True, slots=True)
class Sizes:
    conversations: int
    rounds: int
    runs: int
    export_messages: int
    queued: int


FULL = Sizes(conversations=100_000, rounds=30, runs=20, export_messages=5_000, queued=10_000)
QUICK = Sizes(conversations=50, rounds=1, runs=1, export_messages=20, queued=10)
#: why the smoke run leaves out PostgreSQL's runs/s at 1, 2, 4 and 8 workers (figure 13 measures them)
WORKERS_LEFT_OUT = "PostgreSQL's runs/s with 1, 2, 4 and 8 workers: full run only (figure 13)"


@dataclass
class Side:
    """One stack: its store's size and what each route took, ms."""

    conversations: int
    fill_s: float = 0.0
    fill_rate: float = 0.0
    ms: dict[str, list[float]] = field(default_factory=dict)


@dataclass
class Engine:
    name: str
    empty: Side
    big: Side
    skipped: str = ""
    #: Redis's bytes, and a page of /api/runs and a scrape with ``queued`` runs queued, on this engine
    queued: RedisBytes | None = None


@dataclass
class Export:
    messages: int = 0
    checkpoints: int = 0
    status: int = 0
    ms: float = 0.0
    bytes: int = 0
    rss_before_kb: int = 0
    peak_after_kb: int = 0
    fill_s: float = 0.0


@dataclass
class SideBySide:
    """One long conversation's JSON Lines export on one engine: through the API (a reader
    process), and read both ways in this process as a reader reads (its saver, its serializer):
    oldest first from the writes (``branches.lines``) and every state built whole
    (``branches.lines_by_states``, the way before issue 44)."""

    engine: str
    messages: int
    checkpoints: int
    status: int = 0
    http_ms: float = 0.0
    lines_ms: float = 0.0
    whole_ms: float = 0.0
    #: of ``lines_ms``, the time spent in the saver's listing of the thread (decoding it)
    list_ms: float = 0.0
    #: the full copies of the messages the thread stores, and of them those the first read decoded
    copies: int = 0
    decoded: int = 0
    same: bool = False


def export_lengths(messages: int) -> list[int]:
    """The lengths of the conversations exported side by side: a fifth, half and all of ``messages``."""
    return sorted({max(2, messages // 5), max(2, messages // 2), messages})


@dataclass
class RedisBytes:
    per_queued_run: float = 0.0
    per_stream: float = 0.0
    idle_keys: list[str] = field(default_factory=list)
    idle_bytes: int = 0
    #: with ``queued`` runs queued: a page of /api/runs and a /metrics scrape, ms
    runs_page_ms: list[float] = field(default_factory=list)
    scrape_ms: list[float] = field(default_factory=list)


@dataclass
class Growth:
    sizes: Sizes
    engines: list[Engine] = field(default_factory=list)
    export: Export = field(default_factory=Export)
    exports: list[SideBySide] = field(default_factory=list)
    redis: RedisBytes = field(default_factory=RedisBytes)
    elapsed_s: float = 0.0


def _vm(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


async def _timed(http: httpx.AsyncClient, target: str) -> float:
    started = time.perf_counter()
    answer = await http.get(target)
    if answer.status_code != 200:
        raise BenchError(f"GET {target}: {answer.status_code} {answer.text[:300]}")
    return (time.perf_counter() - started) * 1000


async def _measure_side(stack: Stack, side: Side, sizes: Sizes, rng: random.Random) -> None:
    client = http_client(stack.api_url)
    mine = None
    for _ in range(3):  # warm, and the conversation the reads look at
        mine = (await chat_once(client, f"growth probe {uuid.uuid4().hex[:6]}: {MESSAGE}", None)).conversation
    targets = {
        "page": "/api/conversations?limit=50",
        "search": "/api/conversations?limit=50&q=probe",
        # A term no title holds: every title of the caller's is read (a common one stops at a page).
        "search_rare": "/api/conversations?limit=50&q=no-title-holds-this",
        "detail": f"/api/conversations/{mine}",
        "runs": "/api/runs?limit=50",
        "metrics": "/metrics",
    }
    side.ms = {route: [] for route in (*ROUTES, "run")}
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=120, trust_env=False) as http:
        for _ in range(sizes.rounds):
            order = list(ROUTES)
            rng.shuffle(order)
            for route in order:
                side.ms[route].append(await _timed(http, targets[route]))
    for _ in range(sizes.runs):
        side.ms["run"].append((await chat_once(client, MESSAGE, None)).total_ms)


async def _export(stack: Stack, conversation: str, result: Export, say: Callable[[str], None]) -> None:
    """The long conversation's JSON Lines export, its time and the API process's peak RSS."""
    assert stack.api is not None
    pid = stack.api.popen.pid
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=900, trust_env=False) as http:
        result.rss_before_kb = _vm(pid, "VmRSS")
        say(f"figure 24: exporting {result.messages} messages ({result.checkpoints} checkpoints)")
        started = time.perf_counter()
        answer = await http.get(f"/api/conversations/{conversation}/export", params={"format": "jsonl"})
        result.ms = (time.perf_counter() - started) * 1000
        result.status, result.bytes = answer.status_code, len(answer.content)
        result.peak_after_kb = _vm(pid, "VmHWM")


class _TimedListing:
    """A saver whose ``list`` counts the time spent in it (the rest is delegated)."""

    def __init__(self, saver: Any) -> None:
        self.saver, self.ms = saver, 0.0
        #: the full copies of the messages in what was listed (decoded when first read)
        self.copies: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.saver, name)

    def list(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        found = iter(self.saver.list(*args, **kwargs))
        while True:
            started = time.perf_counter()
            item = next(found, None)
            self.ms += (time.perf_counter() - started) * 1000
            if item is None:
                return
            if (held := item.checkpoint["channel_values"].get("messages")) is not None:
                self.copies.append(held)
            yield item


def _side_by_side(engine: str, where: str, conversation: str, found: SideBySide) -> None:
    """The conversation's export read both ways in this process, each on a connection of its own."""
    import msgspec

    from api.chat import branches
    from shared.storage.threads.branch import thread_at
    from shared.storage.threads.snapshot import ThreadStates
    from shared.storage.threads.source import ThreadSource

    source = (
        ThreadSource("sqlite", f"{Path(where).as_uri()}?mode=ro") if engine == "sqlite"
        else ThreadSource("postgresql", where)
    )
    config = thread_at(conversation)

    def from_the_writes(saver: Any) -> Any:
        timed = _TimedListing(saver)
        lines = branches.lines(False, ThreadStates(cast(Any, timed)), config)[0]
        found.list_ms = timed.ms
        found.copies = len(timed.copies)
        found.decoded = sum(bool(getattr(held, "decoded", True)) for held in timed.copies)
        return lines

    def states_whole(saver: Any) -> Any:
        return branches.lines_by_states(False, ThreadStates(saver), config)[0]

    started = time.perf_counter()
    new = msgspec.json.encode(source.read(from_the_writes))
    found.lines_ms = (time.perf_counter() - started) * 1000
    started = time.perf_counter()
    old = msgspec.json.encode(source.read(states_whole))
    found.whole_ms = (time.perf_counter() - started) * 1000
    found.same = new == old


async def _http_export(stack: Stack, conversation: str, found: SideBySide) -> None:
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=900, trust_env=False) as http:
        started = time.perf_counter()
        answer = await http.get(f"/api/conversations/{conversation}/export", params={"format": "jsonl"})
        found.http_ms = (time.perf_counter() - started) * 1000
        found.status = answer.status_code


def _long_conversations(
    engine: str, where: str, settings: Any, lengths: list[int]
) -> list[tuple[int, int, str]]:
    """One conversation of each length of stored messages written (bigstore's template):
    (messages, checkpoints, its id) each."""

    def of_turns(turns: int) -> set[str]:
        sql = "SELECT conversation_id FROM runs GROUP BY conversation_id HAVING count(*) = ?"
        if engine == "sqlite":
            import sqlite3

            with sqlite3.connect(where) as db:
                return {str(row[0]) for row in db.execute(sql, (turns,))}
        import psycopg

        with psycopg.connect(where) as conn:
            return {str(row[0]) for row in conn.execute(sql.replace("?", "%s"), (turns,))}

    made = []
    for messages in lengths:
        steps = bigstore.template(messages // 2)
        before = of_turns(messages // 2)  # the fill's own may have as many runs
        asyncio.run(bigstore.fill(settings, 1, steps=steps))
        new = of_turns(messages // 2) - before
        if len(new) != 1:
            raise BenchError(f"figure 24: {len(new)} new conversations of {messages} messages after the fill")
        made.append((messages, len(steps), new.pop()))
    return made


async def _redis_bytes(stack: Stack, queued: int, rounds: int, found: RedisBytes) -> None:
    """What Redis holds per finished run's stream and per idle conversation (after three runs), then
    per queued run (``queued`` runs submitted with the worker stopped)."""
    client = http_client(stack.api_url)
    ended = [await chat_once(client, MESSAGE, None) for _ in range(3)]
    r = cast(Any, redis_sync.Redis.from_url(stack.redis.url, decode_responses=True))  # sync replies
    try:
        found.per_stream = statistics.median(r.memory_usage(f"sophos:events:{e.run}") or 0 for e in ended)
        conversation, run = ended[0].conversation, ended[0].run
        found.idle_keys = sorted(k for k in r.scan_iter(count=1000) if conversation in k or run in k)
        found.idle_bytes = sum(r.memory_usage(k) or 0 for k in found.idle_keys)
        stack.stop_worker()
        before = int(r.info("memory")["used_memory"])
        # Submitted as the API submits (shared/redis/queue.py), without a round trip through it each.
        queue_client = Redis.from_url(stack.redis.url)
        try:
            now = time.time()
            for i in range(queued):
                job = RunJob(
                    run_id=str(uuid.uuid4()), conversation_id=str(uuid.uuid4()), kind=JobKind.RUN,
                    message=f"queued {i}", enqueued_at=now + i / 1000, new_conversation=True,
                )
                if await submit_run(queue_client, job, title=f"queued {i}") is not None:
                    raise BenchError("a queued run was refused")
        finally:
            await queue_client.aclose()
        found.per_queued_run = (int(r.info("memory")["used_memory"]) - before) / queued
        async with httpx.AsyncClient(base_url=stack.api_url, timeout=120, trust_env=False) as http:
            for _ in range(rounds):
                found.runs_page_ms.append(await _timed(http, "/api/runs?limit=50"))
                found.scrape_ms.append(await _timed(http, "/metrics"))
    finally:
        r.close()


def _engine(
    engine: str, result: Growth, rng: random.Random, pg: PostgresServer | None,
    say: Callable[[str], None], keep: bool,
) -> Engine:
    """One stack: measured on its empty database, then filled (the worker and API stopped) and
    measured again; the long conversations are written with the fill and exported. Last, on each
    engine, ``queued`` runs queued (a page of /api/runs and a scrape with them), and Redis's bytes
    (reported once: SQLite's)."""
    sizes = result.sizes
    done = Engine(engine, Side(0), Side(sizes.conversations))
    overrides = {"DATABASE_URL": pg.create_database()} if pg is not None else {}
    with running_stack(overrides=overrides, keep=keep) as stack:
        where = overrides.get("DATABASE_URL") or str(stack.database_path)
        settings = bigstore.settings_for(engine, where)
        stack.start()
        asyncio.run(_measure_side(stack, done.empty, sizes, rng))
        stack.stop_worker()
        if stack.api is not None:
            stack.api.stop()
            stack.api = None
        say(f"figure 24: {engine}, filling {sizes.conversations:,} conversations")
        filled = asyncio.run(bigstore.fill(settings, sizes.conversations, say=say))
        done.big.fill_s, done.big.fill_rate = filled.seconds, filled.rate
        say(f"figure 24: {engine}, {filled.rate:.0f} conversations/s ({filled.seconds:.0f} s)")
        started = time.perf_counter()
        longs = _long_conversations(engine, where, settings, export_lengths(sizes.export_messages))
        filled_s = time.perf_counter() - started
        stack.start()
        asyncio.run(_measure_side(stack, done.big, sizes, rng))
        for messages, checkpoints, conversation in longs:
            say(f"figure 24: {engine}, exporting {messages} messages ({checkpoints} checkpoints), both ways")
            found = SideBySide(engine, messages, checkpoints)
            asyncio.run(_http_export(stack, conversation, found))
            _side_by_side(engine, where, conversation, found)
            result.exports.append(found)
        if engine == "sqlite":
            messages, checkpoints, long_one = longs[-1]
            result.export = Export(messages=messages, checkpoints=checkpoints, fill_s=filled_s)
            asyncio.run(_export(stack, long_one, result.export, say))
        say(f"figure 24: {engine}, {sizes.queued:,} runs queued")
        done.queued = RedisBytes()
        asyncio.run(_redis_bytes(stack, sizes.queued, sizes.rounds, done.queued))
        if engine == "sqlite":
            result.redis = done.queued
    return done


def measure(
    *, quick: bool, rng: random.Random, keep: bool = False, conversations: int | None = None,
    export_messages: int | None = None, say: Callable[[str], None] = lambda _: None,
) -> Growth:
    sizes = QUICK if quick else FULL
    sizes = Sizes(
        conversations or sizes.conversations, sizes.rounds, sizes.runs,
        export_messages or sizes.export_messages, sizes.queued,
    )
    started = time.monotonic()
    result = Growth(sizes=sizes)
    pg = PostgresServer()
    why = pg.unreachable()
    try:
        result.engines.append(_engine("sqlite", result, rng, None, say, keep))
        if quick:  # the smoke run: one engine is enough to show the figure works
            why = why or "not in the smoke run"
            say(f"figure 24: left out of the smoke run: {WORKERS_LEFT_OUT}")
        if why:
            result.engines.append(Engine("postgres", Side(0), Side(0), skipped=why))
        else:
            result.engines.append(_engine("postgres", result, rng, pg, say, keep))
    finally:
        pg.drop_all()
    result.elapsed_s = time.monotonic() - started
    return result


HEADING = "## Growing with the work: a request's cost on a big store (figure 24)"

_NAMES = {
    "page": "a page of conversations (50)", "search": "a title search (`q`, 50)",
    "search_rare": "a title search no title matches",
    "detail": "a conversation's detail", "runs": "a page of `/api/runs` (50)",
    "metrics": "a `/metrics` scrape", "run": "a run, POST → `end`",
}


def _p50(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def section(g: Growth, *, stamp: str = "") -> str:
    s = g.sizes
    out = [
        f"{HEADING}\n",
        f"Per engine, one stack measured twice: on its empty database, then (worker and API stopped) "
        f"filled with {s.conversations:,} conversations of ten stored messages (five runs each and their "
        f"checkpoints: bench/bigstore.py, through the worker's store and LangGraph's saver) and started "
        f"again. Each time three runs, then {s.rounds} rounds of the {len(ROUTES)} reads in a random order, "
        f"then {s.runs} runs one at a time. p50 ms; the ratio is big over empty. Took {g.elapsed_s:.0f} s.\n",
    ]
    if stamp:
        out.append(stamp.strip() + "\n")
    for e in g.engines:
        if e.skipped:
            out.append(f"**{e.name}**: not measured ({e.skipped}).\n")
            continue
        out.append(
            f"**{e.name}**: filled at {e.big.fill_rate:,.0f} conversations/s ({e.big.fill_s:.0f} s for "
            f"{e.big.conversations:,}).\n\n| {e.name} | empty p50 ms | big p50 ms | ratio |\n"
            "|---|---:|---:|---:|"
        )
        for route in (*ROUTES, "run"):
            a, b = _p50(e.empty.ms.get(route, [])), _p50(e.big.ms.get(route, []))
            out.append(f"| {_NAMES[route]} | {a:.1f} | {b:.1f} | {b / a if a else float('nan'):.2f}× |")
        out.append("")
    x = g.export
    out.append(
        f"**JSON Lines export** of one conversation of {x.messages:,} stored messages ({x.checkpoints:,} "
        f"checkpoints, SQLite): HTTP {x.status}, {x.ms:,.0f} ms, {x.bytes:,} bytes; the API process's RSS "
        f"{x.rss_before_kb / 1024:.0f} MB before, peak {x.peak_after_kb / 1024:.0f} MB after (`VmHWM`; the "
        f"thread is rebuilt in a reader process, not counted).\n"
    )
    if g.exports:
        out.append(
            "**The JSON Lines export, read from the writes (issue 44) and as before**, side by side on "
            "the same conversation (bench/bigstore.py's template: a question and an answer a run; "
            "LangGraph's full copy of the messages every 100 updates): through the API (a reader "
            "process), and read in the bench's process as a reader reads, oldest first from the writes "
            "stored on each parent (`branches.lines`) and with every state built whole "
            "(`branches.lines_by_states`, the way before); same: the two give the same bytes. Both "
            "list the checkpoints through LangGraph's saver; the reader's serializer decodes a full "
            "copy of the messages (one every 100 updates or so) only when it is read "
            "(shared/storage/threads/decoding.py), and the first reads a checkpoint holding one from "
            "its parent's messages and writes, as any other, where the copy is theirs "
            "(shared/storage/threads/history.py `_follows`): the copies it still decoded are counted. "
            "The rest of the second builds every state whole and is not linear.\n\n"
            "| engine | messages | checkpoints | API export ms | from the writes ms | states built whole ms "
            "| ratio | of the first, the saver's listing ms | the first less its listing, µs/message "
            "| full copies decoded by the first | same |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
        )
        for x2 in g.exports:
            ratio = x2.whole_ms / x2.lines_ms if x2.lines_ms else float("nan")
            out.append(
                f"| {x2.engine} | {x2.messages:,} | {x2.checkpoints:,} "
                f"| {x2.http_ms:,.0f} (HTTP {x2.status}) "
                f"| {x2.lines_ms:,.0f} | {x2.whole_ms:,.0f} | {ratio:.1f}× "
                f"| {x2.list_ms:,.0f} | {1000 * (x2.lines_ms - x2.list_ms) / x2.messages:,.0f} "
                f"| {x2.decoded} of {x2.copies} | {'yes' if x2.same else '**no**'} |"
            )
        out.append("")
    out.append(
        "**What still grows, and why.** A title search reads titles newest first until it has a page of "
        "matches (SQLite folds each with Python's `casefold`, PostgreSQL with `ILIKE`): a term in recent "
        "titles costs a page, a term no title holds reads every title of the caller's, so its time grows "
        "with their conversations (the rows above). No index serves a case-folded substring match as it "
        "is defined here: SQLite's FTS5 trigram tokenizer folds case differently from `casefold`, and "
        "PostgreSQL's `pg_trgm` is an extension the service cannot count on; an owner's titles are "
        "the bound. The JSON Lines export's own work no longer grows faster than the conversation: it "
        "reads the branch oldest first, each checkpoint's messages its parent's after the writes stored "
        "on the parent (shared/storage/threads/history.py `path`), and builds whole only the checkpoints "
        "where that may not hold (the first, `update_state`'s, a fork's first, a copy of the messages "
        "that is not its parent's after the writes). The full copies of the messages LangGraph stores "
        "are decoded only when read, so listing the checkpoints no longer decodes the whole list "
        "again every 100 updates (the export's table above: the copies decoded).\n"
    )
    r = g.redis
    kinds = ", ".join(f"`{key.split(':')[1]}`" for key in r.idle_keys) or "none"
    out.append(
        f"**Redis**: {r.per_queued_run:,.0f} bytes per queued run (`used_memory` over {s.queued:,} runs "
        f"queued by the API's submit script, the worker stopped); {r.per_stream:,.0f} bytes per finished "
        f"run's event stream (`MEMORY USAGE`, kept `EVENT_RETENTION`); a conversation whose runs ended: "
        f"{len(r.idle_keys)} key(s), {r.idle_bytes:,} bytes ({kinds}).\n"
    )
    for engine in g.engines:
        q = engine.queued
        if engine.skipped or q is None or not q.runs_page_ms:
            continue
        page0, scrape0 = _p50(engine.big.ms["runs"]), _p50(engine.big.ms["metrics"])
        page, scrape = _p50(q.runs_page_ms), _p50(q.scrape_ms)
        out.append(
            f"**With {s.queued:,} runs queued** ({engine.name}, the big store, the worker stopped): a "
            f"page of `/api/runs` (50) {page:.1f} ms against {page0:.1f} ms with none queued "
            f"({page / page0:.2f}×); "
            f"a `/metrics` scrape {scrape:.1f} ms against {scrape0:.1f} ms ({scrape / scrape0:.2f}×).\n"
        )
    out.append(
        "**Open streams on one API process**: figure 26 (1,000 streams, each on a queued run of its own; "
        "a stack of its own, `--only streams`).\n"
    )
    out.append(
        "**PostgreSQL with 1, 2, 4 and 8 workers**: figure 13 (runs/s per worker count, full run only; "
        "the smoke run leaves it out).\n"
    )
    return "\n".join(out)
