"""Figure 25: pruning checkpoints (issue 44 part 3; shared/storage/threads/pruning.py).

For each engine (SQLite, and PostgreSQL when one answers), two stores filled by bench/bigstore.py
(the worker's rows, its threads through LangGraph's saver): its default conversations (five turns,
ten stored messages: no full copy of the messages yet, nothing to prune) and long ones (sixty
turns, 120 messages: a full copy at the 100th update). Each thread is pruned as the worker's prune
does it (``prune_thread``, one transaction per thread); measured: checkpoint rows, write rows
(and PostgreSQL's blobs) and the database's bytes in use before and after, and the time per
1,000 threads pruned. The latest state of one conversation is read before and after: the same.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import bigstore
from tests.support.postgres import PostgresServer

HEADING = "## Pruning checkpoints (figure 25)"

#: (label, conversations, turns) per store: full run, and --quick
STORES = (("bigstore's default (5 turns)", 1000, 5), ("long threads (60 turns)", 200, 60))
QUICK_STORES = (("long threads (60 turns)", 2, 60),)


@dataclass
class Store:
    engine: str
    label: str
    conversations: int
    turns: int
    rows_before: dict[str, int] = field(default_factory=dict)
    rows_after: dict[str, int] = field(default_factory=dict)
    bytes_before: int = 0
    bytes_after: int = 0
    deleted: int = 0
    prune_s: float = 0.0
    same_state: bool = False

    @property
    def ms_per_thousand(self) -> float:
        return self.prune_s * 1000 / self.conversations * 1000


@dataclass
class Pruning:
    stores: list[Store] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    elapsed_s: float = 0.0


async def _sqlite_figures(path: Path) -> tuple[dict[str, int], int]:
    import aiosqlite

    async with aiosqlite.connect(path) as conn:
        rows = {}
        for table in ("checkpoints", "writes"):
            found = await conn.execute_fetchall(f"SELECT count(*) FROM {table}")  # noqa: S608 - our names
            rows[table] = int(next(iter(found))[0])
        await conn.execute("VACUUM")
        pages = next(iter(await conn.execute_fetchall("PRAGMA page_count")))[0]
        size = next(iter(await conn.execute_fetchall("PRAGMA page_size")))[0]
    return rows, int(pages) * int(size)


async def _postgres_figures(url: str) -> tuple[dict[str, int], int]:
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        rows, total = {}, 0
        for table in ("checkpoints", "checkpoint_writes", "checkpoint_blobs"):
            cur = await conn.execute(f"SELECT count(*) FROM {table}")  # noqa: S608 - our names
            rows[table] = int((await cur.fetchone() or (0,))[0])
            await conn.execute(f"VACUUM FULL {table}")
            cur = await conn.execute("SELECT pg_total_relation_size(%s)", (table,))
            total += int((await cur.fetchone() or (0,))[0])
    return rows, total


async def _prune_all(settings: Any, store: Store) -> None:
    """Prune every thread of the store as the worker's job does, timing it; check one state."""
    from shared.storage.threads.branch import thread_at
    from shared.storage.threads.pruning import prune_thread
    from shared.storage.threads.state import reader_graph

    async with _open_saver(settings) as saver:
        graph = reader_graph(saver)
        threads = sorted({str(c.config["configurable"]["thread_id"]) async for c in saver.alist(None)})
        probe = threads[0]
        before = (await graph.aget_state(thread_at(probe))).values["messages"]
        started = time.perf_counter()
        for thread in threads:
            store.deleted += (await prune_thread(saver, thread)).deleted
        store.prune_s = time.perf_counter() - started
        after = (await graph.aget_state(thread_at(probe))).values["messages"]
        store.same_state = [m.id for m in before] == [m.id for m in after] and len(after) == 2 * store.turns


class _open_saver:
    """The engine's saver, as the worker opens it (its tables set up by the fill)."""

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self._close: Callable[[], Any] | None = None

    async def __aenter__(self) -> Any:
        if self.settings.database_url is None:
            from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

            cm: Any = AsyncSqliteSaver.from_conn_string(str(self.settings.database_path))
        else:
            from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

            cm = AsyncPostgresSaver.from_conn_string(self.settings.database_url)
        saver = await cm.__aenter__()
        self._close = lambda: cm.__aexit__(None, None, None)
        return saver

    async def __aexit__(self, *exc: object) -> None:
        if self._close is not None:
            await self._close()


async def _measure_store(engine: str, where: str, label: str, conversations: int, turns: int,
                         say: Callable[[str], None]) -> Store:
    store = Store(engine, label, conversations, turns)
    settings = bigstore.settings_for(engine, where)
    filled = await bigstore.fill(settings, conversations, steps=bigstore.template(turns))
    say(f"  {engine} {label}: {filled.conversations} conversations in {filled.seconds:.1f} s")
    figures = _sqlite_figures(Path(where)) if engine == "sqlite" else _postgres_figures(where)
    store.rows_before, store.bytes_before = await figures
    await _prune_all(settings, store)
    figures = _sqlite_figures(Path(where)) if engine == "sqlite" else _postgres_figures(where)
    store.rows_after, store.bytes_after = await figures
    return store


def measure(*, quick: bool, say: Callable[[str], None]) -> Pruning:
    started = time.perf_counter()
    result = Pruning()
    stores = QUICK_STORES if quick else STORES
    with tempfile.TemporaryDirectory(prefix="sophos-prune-") as tmp:
        for i, (label, n, turns) in enumerate(stores):
            result.stores.append(asyncio.run(
                _measure_store("sqlite", str(Path(tmp) / f"store-{i}.db"), label, n, turns, say)
            ))
    server = PostgresServer()
    reason = "the full run only; --quick measures SQLite" if quick else server.unreachable()
    if reason is not None:
        result.skipped["postgresql"] = reason
    else:
        try:
            for label, n, turns in stores:
                url = server.create_database()
                result.stores.append(asyncio.run(_measure_store("postgresql", url, label, n, turns, say)))
        finally:
            server.drop_all()
    result.elapsed_s = time.perf_counter() - started
    return result


def section(p: Pruning, *, stamp: str = "") -> str:
    out = [
        HEADING, "",
        "Every thread of a store made by `bench/bigstore.py` pruned as the worker's prune does it "
        "(`shared/storage/threads/pruning.py` `prune_thread`, one transaction per thread; what is kept: "
        "docs/operating.md, \"Pruning checkpoints\"). Rows and bytes in use (SQLite: pages after "
        "`VACUUM`; PostgreSQL: the three tables after `VACUUM FULL`) before and after. The time is "
        f"the prune's alone, per 1,000 threads. Took {p.elapsed_s:.0f} s.", "",
    ]
    if stamp:
        out += [stamp.strip(), ""]
    out += [
        "| engine | store | conversations | checkpoint rows | write rows | bytes | ms per 1,000 threads "
        "| state read back |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for s in p.stores:
        checkpoints = f"{s.rows_before['checkpoints']:,} → {s.rows_after['checkpoints']:,}"
        writes_table = "writes" if s.engine == "sqlite" else "checkpoint_writes"
        writes = f"{s.rows_before[writes_table]:,} → {s.rows_after[writes_table]:,}"
        size = f"{s.bytes_before / 1e6:.1f} → {s.bytes_after / 1e6:.1f} MB"
        out.append(
            f"| {s.engine} | {s.label} | {s.conversations:,} | {checkpoints} | {writes} | {size} "
            f"| {s.ms_per_thousand:,.0f} | {'the same' if s.same_state else 'DIFFERENT'} |"
        )
    for engine, reason in p.skipped.items():
        out.append(f"\n**{engine}**: not measured ({reason}).")
    out.append("")
    return "\n".join(out)
