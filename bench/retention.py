"""Figure 27: retention deleting old conversations beside live runs (issue 44; worker/upkeep/retention.py).

For each engine (SQLite, and PostgreSQL when one answers; ``--quick`` measures SQLite only), one
stack of its own (Redis, fake model, one worker with ``CONVERSATION_RETENTION_DAYS`` on, the API),
its store first filled with ``conversations`` conversations by bench/bigstore.py (the worker's
rows, a thread's checkpoints each; bigstore's last ``finish_run`` stamps ``updated_at`` with the
time of the fill, so none is old yet):

1. live runs one at a time (POST -> ``end``): the runs *before*;
2. the filled conversations made old: their ``created_at``/``updated_at`` set ``AGE_DAYS`` back,
   past the retention (what retention.py selects: ``updated_at`` older than the retention). The
   worker's retention queues their deletes ``BATCH`` at a time, the next batch as soon as the
   last one's are done (self-clocking, not a batch per sweep pass), and its delete jobs
   (worker/upkeep/deletion.py) do them between runs, while live runs go on one at a time: the runs
   *during*. The old conversations left are counted in the database every ``POLL_SECONDS`` until
   none is left: the deletion's throughput is their number over the time from their aging to
   none left.
3. then, with no live run, the other ``idle`` filled conversations (filled with the rest, so not
   old until now) made old the same way: the drain of an idle service, timed the same way.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench import bigstore
from bench.client import chat_once, http_client
from bench.runs import MESSAGE
from bench.stack import running_stack
from bench.stats import Summary, ratio
from shared.storage.schema import iso_from_timestamp
from tests.support.postgres import PostgresServer

HEADING = "## Retention beside live runs (figure 27)"

RETENTION_DAYS = "7"
#: how far back the filled conversations' timestamps are set: well past the retention
AGE_DAYS = 30
POLL_SECONDS = 0.5
DAY = 86_400.0


@dataclass(frozen=True, slots=True)
class Sizes:
    conversations: int
    runs_before: int
    #: drained afterwards with no live run beside
    idle: int
    #: seconds between two live runs during the drain (0: back to back)
    pause: float = 0.0


#: 1,000: beside runs sent back to back the batches adapt to one delete (about 4 a second on
#: SQLite, 2.6 on PostgreSQL, as measured), so a drain of 4 to 7 minutes an engine, with hundreds of
#: live runs beside it; then 1,000 with no live run (full batches, under a minute)
FULL = Sizes(conversations=1000, runs_before=30, idle=1000)
#: the drain waits for the sweep's next pass (worker/upkeep/sweep.py: up to 5 s) whatever its size:
#: the smoke run's live runs are paced beside it, a few dozen instead of hundreds
QUICK = Sizes(conversations=10, runs_before=3, idle=10, pause=0.1)


@dataclass
class Engine:
    name: str
    conversations: int
    fill_s: float = 0.0
    #: from their aging to no old conversation left (or to giving up)
    drain_s: float = 0.0
    #: old conversations still there when it gave up (0: all deleted)
    left: int = 0
    before_ms: list[float] = field(default_factory=list)
    during_ms: list[float] = field(default_factory=list)
    #: the drain with no live run: how many, how long, how many left
    idle: int = 0
    idle_s: float = 0.0
    idle_left: int = 0

    @property
    def rate(self) -> float:
        return (self.conversations - self.left) / self.drain_s if self.drain_s else float("nan")

    @property
    def idle_rate(self) -> float:
        return (self.idle - self.idle_left) / self.idle_s if self.idle_s else float("nan")


@dataclass
class Retention:
    sizes: Sizes
    engines: list[Engine] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    elapsed_s: float = 0.0


class _Count:
    """The old conversations left, counted on a connection of the bench's own."""

    def __init__(self, engine: str, where: str) -> None:
        self.engine, self.where = engine, where
        self.marker = "?" if engine == "sqlite" else "%s"

    def _connect(self) -> Any:
        if self.engine == "sqlite":
            import sqlite3

            return sqlite3.connect(self.where, timeout=30)
        import psycopg

        return psycopg.connect(self.where, autocommit=True)

    def age(self, ids: list[str]) -> int:
        """Set these conversations' timestamps ``AGE_DAYS`` back; how many."""
        old = iso_from_timestamp(time.time() - AGE_DAYS * DAY)
        conn = self._connect()
        try:
            m = self.marker
            cur = conn.cursor()
            cur.executemany(
                f"UPDATE conversations SET created_at = {m}, updated_at = {m} WHERE id = {m}",  # noqa: S608
                [(old, old, i) for i in ids],
            )
            conn.commit()
            return len(ids)
        finally:
            conn.close()

    def left(self) -> int:
        cutoff = iso_from_timestamp(time.time() - float(RETENTION_DAYS) * DAY)
        conn = self._connect()
        try:
            row = conn.execute(
                f"SELECT count(*) FROM conversations WHERE updated_at < {self.marker}", (cutoff,)  # noqa: S608
            ).fetchone()
            return int(row[0])
        finally:
            conn.close()


async def _runs(url: str, n: int | None, done: threading.Event | None, pause: float = 0.0) -> list[float]:
    """Live runs one at a time, ``pause`` seconds apart: ``n`` of them, or until ``done`` is set."""
    client = http_client(url)
    out: list[float] = []
    while (n is not None and len(out) < n) or (done is not None and not done.is_set()):
        out.append((await chat_once(client, MESSAGE, None)).total_ms)
        if pause:
            await asyncio.sleep(pause)
    return out


def _engine(engine: str, sizes: Sizes, pg: PostgresServer | None, keep: bool,
            say: Callable[[str], None]) -> Engine:
    done = Engine(engine, sizes.conversations, idle=sizes.idle)
    overrides = {"DATABASE_URL": pg.create_database()} if pg is not None else {}
    retention = {"CONVERSATION_RETENTION_DAYS": RETENTION_DAYS}
    with running_stack(overrides=overrides, keep=keep) as stack:
        where = overrides.get("DATABASE_URL") or str(stack.database_path)
        count = _Count(engine, where)
        total = sizes.conversations + sizes.idle
        say(f"figure 27: {engine}, filling {total:,} conversations")
        filled = asyncio.run(bigstore.fill(bigstore.settings_for(engine, where), total))
        done.fill_s = filled.seconds
        all_ids = [str(r[0]) for r in _ids(count)]
        filled_ids, idle_ids = all_ids[:sizes.conversations], all_ids[sizes.conversations:]
        stack.start(**retention)
        # Before: the same stack, its store as big, nothing old yet.
        done.before_ms = asyncio.run(_runs(stack.api_url, sizes.runs_before, None))
        # Give up below 1 a second (the pace before the retention clocked itself was 2).
        patience = 60 + sizes.conversations
        drained = threading.Event()
        started = time.perf_counter()
        aged = count.age(filled_ids)
        if aged != sizes.conversations:
            raise RuntimeError(f"figure 27: {aged} conversations aged, {sizes.conversations} filled")
        say(f"figure 27: {engine}, {aged:,} made old; live runs beside the retention deleting them")

        def poll() -> None:
            last_said = started
            try:
                while True:
                    done.left = count.left()
                    now = time.perf_counter()
                    if done.left == 0 or now - started > patience:
                        done.drain_s = now - started
                        return
                    if now - last_said > 60:
                        say(f"  {engine}: {done.left:,} left after {now - started:.0f} s")
                        last_said = now
                    time.sleep(POLL_SECONDS)
            finally:
                drained.set()

        poller = threading.Thread(target=poll, name="retention-poll", daemon=True)
        poller.start()
        try:
            done.during_ms = asyncio.run(_runs(stack.api_url, None, drained, sizes.pause))
        finally:
            drained.wait()
            poller.join()
        # Idle: the rest made old, nothing else going on.
        say(f"figure 27: {engine}, {len(idle_ids):,} made old with no live run")
        started = time.perf_counter()
        count.age(idle_ids)
        while (left := count.left()) and time.perf_counter() - started < 60 + len(idle_ids):
            time.sleep(POLL_SECONDS)
        done.idle_s, done.idle_left = time.perf_counter() - started, left
    return done


def _ids(count: _Count) -> list[tuple[Any, ...]]:
    conn = count._connect()
    try:
        return list(conn.execute("SELECT id FROM conversations").fetchall())
    finally:
        conn.close()


def measure(*, quick: bool, keep: bool = False, conversations: int | None = None,
            say: Callable[[str], None] = lambda _: None) -> Retention:
    started = time.perf_counter()
    sizes = QUICK if quick else FULL
    if conversations is not None:
        sizes = dataclasses.replace(sizes, conversations=conversations)
    result = Retention(sizes)
    result.engines.append(_engine("sqlite", sizes, None, keep, say))
    server = PostgresServer()
    reason = "the full run only; --quick measures SQLite" if quick else server.unreachable()
    if reason is not None:
        result.skipped["postgresql"] = reason
    else:
        try:
            result.engines.append(_engine("postgresql", sizes, server, keep, say))
        finally:
            server.drop_all()
    result.elapsed_s = time.perf_counter() - started
    return result


def section(r: Retention, *, stamp: str = "") -> str:
    from worker.upkeep.retention import BATCH
    from worker.upkeep.sweep import SWEEP_SECONDS

    out = [
        HEADING, "",
        f"Per engine, one stack (one worker with `CONVERSATION_RETENTION_DAYS={RETENTION_DAYS}`), its "
        f"store filled first with {r.sizes.conversations:,} conversations by `bench/bigstore.py` (ten "
        f"stored messages each, none old yet): {r.sizes.runs_before} live runs one at a time (*before*); "
        f"then the filled conversations' `created_at`/`updated_at` set {AGE_DAYS} days back and the "
        "worker's sweep deleting them (worker/upkeep/retention.py, worker/upkeep/deletion.py) while live "
        f"runs go on one at a time{f', {r.sizes.pause:g} s apart' if r.sizes.pause else ''} (*during*) "
        "until the database holds no old conversation (counted every "
        f"{POLL_SECONDS} s). Throughput: the conversations deleted over the time from their aging to "
        f"none left. Then *idle*: {r.sizes.idle:,} more (filled with the others) made old with no live "
        f"run, drained and timed the same way. The retention queues up to {BATCH} deletes at a time, "
        "the next batch as soon as the last one's are done and the runs waiting then are taken (a "
        "single delete when runs were found waiting, twice the last batch otherwise; before issue 44: "
        f"one batch a {SWEEP_SECONDS:.0f} s sweep pass, at most {BATCH / SWEEP_SECONDS:.0f} "
        f"conversations/s). Took {r.elapsed_s:.0f} s.", "",
    ]
    if stamp:
        out += [stamp.strip(), ""]
    out += [
        "| engine | old conversations | deleted in | conversations/s | runs before / during "
        "| POST → end p50 before → during (ratio) | p95 before → during (ratio) "
        "| idle: deleted in | idle: conversations/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for e in r.engines:
        b, d = Summary.of(e.before_ms), Summary.of(e.during_ms)
        left = "" if e.left == 0 else f" (gave up, {e.left:,} left)"
        idle_left = "" if e.idle_left == 0 else f" (gave up, {e.idle_left:,} left)"
        out.append(
            f"| {e.name} | {e.conversations:,} | {e.drain_s:.0f} s{left} | {e.rate:.2f} "
            f"| {b.n} / {d.n} | {b.p50:.0f} → {d.p50:.0f} ms ({ratio(d.p50, b.p50):.2f}×) "
            f"| {b.p95:.0f} → {d.p95:.0f} ms ({ratio(d.p95, b.p95):.2f}×) "
            f"| {e.idle:,} in {e.idle_s:.0f} s{idle_left} | {e.idle_rate:.2f} |"
        )
    for engine, reason in r.skipped.items():
        out.append(f"\n**{engine}**: not measured ({reason}).")
    out.append("")
    return "\n".join(out)
