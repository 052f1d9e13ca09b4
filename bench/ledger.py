"""Figure 14: the ledger's cost. A turn with tool calls, with the ledger and without it.

In-process, like the floor (bench/floor.py): the worker's own graph
(``worker.agent.graph.build_graph``), ``ChatOllama`` against a fake model of its own
that answers the first call of a run with two ``tools__echo`` calls in one
message (two tasks, as the worker runs them) and the second with the 20-token
answer, the real MCP tools server through ``worker.tools.mcp.McpToolbox``, and
the database the worker opens: the saver on a connection of its own
(``open_checkpointer``) and the application tables, migrated, on another
(``open_database``: ``SqliteDatabase``, WAL, ``synchronous=FULL``), one file.

Two graphs are compiled on those same resources, one with ``Ledger(db)`` and one
with ``ledger=None`` (a switch of the benchmark only: the worker always has one).
Each run is a new conversation whose ``conversations`` row is written before the
clock starts (the ledger's rows refer to it; the worker writes it with the run's
row). The runs of both are shuffled into one random order in one process, so the
machine's noise falls on both alike. Per run: the wall time of ``graph.astream``
to its end (what POST → ``end`` is in the service) and the CPU time of this
process over it (``time.process_time``: every thread, aiosqlite's included; the
MCP server and the model are processes of their own, the same for both).
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field

from bench.client import BenchError
from bench.floor import Floor
from bench.model_server import ANSWER_TOKENS
from bench.runs import MESSAGE
from bench.stack import running_stack
from bench.stats import Summary, ratio
from shared.settings import Settings
from shared.storage import Database
from shared.storage.engines import open_checkpointer, open_database
from shared.storage.schema import now_iso
from worker.agent.graph import build_graph, read_system_prompt
from worker.agent.model import build_model
from worker.tools.ledger.calls import Ledger
from worker.tools.mcp import McpToolbox, load_config
from worker.tools.policy import load_approvals, load_repeat

#: tool calls in the model's first answer of each run
CALLS = 2
WITH, WITHOUT = "with the ledger", "without"


@dataclass(frozen=True, slots=True)
class Sizes:
    warm: int
    runs: int


FULL = Sizes(warm=10, runs=200)
QUICK = Sizes(warm=2, runs=5)


@dataclass
class LedgerCost:
    """Per run of each arm: wall ms of ``astream`` to its end, and CPU ms of this process."""

    calls: int
    runs: int
    quick: bool = False
    wall_ms: dict[str, list[float]] = field(default_factory=lambda: {WITH: [], WITHOUT: []})
    cpu_ms: dict[str, list[float]] = field(default_factory=lambda: {WITH: [], WITHOUT: []})
    #: ledger rows found done after the runs (two per run with the ledger, none without)
    rows_done: int = 0
    rows_without: int = 0
    elapsed_s: float = 0.0
    #: how it was measured (a run of this figure alone has its own)
    command: str = ""
    date: str = ""
    code: str = ""
    load: str = ""

    def per_call(self, what: str, arm: str) -> Summary:
        """Median and p95 over the runs of ``arm``, divided by the calls per run."""
        values = (self.wall_ms if what == "wall" else self.cpu_ms)[arm]
        return Summary.of([v / self.calls for v in values])

    def difference(self, what: str) -> tuple[float, float]:
        """(with minus without, with / without) of the medians per call."""
        a, b = self.per_call(what, WITH).p50, self.per_call(what, WITHOUT).p50
        return a - b, ratio(a, b)


@asynccontextmanager
async def two_graphs(
    settings: Settings, env: Mapping[str, str]
) -> AsyncIterator[tuple[Floor, Floor, Database]]:
    """The worker's resources, once; a graph with the ledger and one without, on them."""
    async with AsyncExitStack() as stack:
        saver = await stack.enter_async_context(open_checkpointer(settings, size=1))
        db = await open_database(settings, max_size=2)
        stack.push_async_callback(db.close)
        toolbox = McpToolbox.from_config(
            load_config(settings.mcp_config_path, env),
            start_timeout=settings.mcp_start_timeout,
            call_timeout=settings.mcp_call_timeout,
            repeat=load_repeat(settings.mcp_config_path),
        )
        stack.push_async_callback(toolbox.close)
        await toolbox.open()
        if not toolbox.tools:
            raise BenchError(f"figure 14: the MCP tools server did not start: {toolbox.status()}")
        model = build_model(settings)
        prompt = read_system_prompt(settings.system_prompt_path)
        approvals = load_approvals(settings.mcp_config_path)

        def graph(ledger: Ledger | None) -> Floor:
            return Floor(
                build_graph(
                    model=model, tools=toolbox.current, system_prompt=prompt, checkpointer=saver,
                    needs_approval=approvals, ledger=ledger,
                ),
                settings,
            )

        yield graph(Ledger(db)), graph(None), db


async def _conversation(db: Database) -> str:
    conversation = str(uuid.uuid4())
    now = now_iso()
    async with db.transaction() as tx:
        await tx.execute(
            "INSERT INTO conversations (id, title, created_at, updated_at) VALUES (?, ?, ?, ?)",
            (conversation, MESSAGE, now, now),
        )
    return conversation


async def _run(graph: Floor, db: Database, arm: str) -> tuple[str, float, float]:
    conversation = await _conversation(db)
    cpu = time.process_time()
    run = await graph.run(conversation, MESSAGE)
    cpu_ms = (time.process_time() - cpu) * 1000
    if run.tool_results != CALLS or run.tokens != len(ANSWER_TOKENS):
        raise BenchError(
            f"figure 14 ({arm}): a run made {run.tool_results} tool calls and streamed {run.tokens} "
            f"tokens, not {CALLS} and {len(ANSWER_TOKENS)}"
        )
    return conversation, run.total_ms, cpu_ms


async def _measure(settings: Settings, env: Mapping[str, str], sizes: Sizes, rng: random.Random,
                   result: LedgerCost) -> None:
    async with two_graphs(settings, env) as (with_ledger, without, db):
        graphs = {WITH: with_ledger, WITHOUT: without}
        for _ in range(sizes.warm):
            for arm, graph in graphs.items():
                await _run(graph, db, arm)
        order = [WITH, WITHOUT] * sizes.runs
        rng.shuffle(order)
        conversations: dict[str, list[str]] = {WITH: [], WITHOUT: []}
        for arm in order:
            conversation, wall_ms, cpu_ms = await _run(graphs[arm], db, arm)
            conversations[arm].append(conversation)
            result.wall_ms[arm].append(wall_ms)
            result.cpu_ms[arm].append(cpu_ms)
        result.rows_done = await _count(db, conversations[WITH], "done")
        result.rows_without = await _count(db, conversations[WITHOUT], None)
    if result.rows_done != CALLS * sizes.runs or result.rows_without:
        raise BenchError(
            f"figure 14: {result.rows_done} ledger rows done for {sizes.runs} runs of {CALLS} calls "
            f"with the ledger, {result.rows_without} rows for the runs without"
        )


async def _count(db: Database, conversations: list[str], state: str | None) -> int:
    total = 0
    for conversation in conversations:
        sql = "SELECT COUNT(*) FROM tool_calls WHERE conversation_id = ?"
        params: tuple[str, ...] = (conversation,)
        if state is not None:
            sql, params = sql + " AND state = ?", (conversation, state)
        total += int((await db.fetchall(sql, params))[0][0])
    return total


def measure(
    *,
    quick: bool,
    rng: random.Random,
    overrides: Mapping[str, str] | None = None,
    keep: bool = False,
    runs: int | None = None,
    say: Callable[[str], None] = lambda _: None,
) -> LedgerCost:
    """Figure 14 on a fake model of its own; raises :class:`BenchError` when a run misbehaves."""
    started = time.monotonic()
    base = QUICK if quick else FULL
    sizes = Sizes(warm=base.warm, runs=runs or base.runs)
    result = LedgerCost(calls=CALLS, runs=sizes.runs, quick=quick)
    say(f"figure 14: {sizes.runs} runs with the ledger and {sizes.runs} without, {CALLS} tool calls each")
    with running_stack(overrides=overrides, keep=keep, model_calls=CALLS) as stack:
        path = stack.root / "ledger" / "ledger.db"
        path.parent.mkdir(parents=True, exist_ok=True)
        settings = Settings.from_env(stack.settings_env(DATABASE_PATH=str(path)))
        asyncio.run(_measure(settings, dict(stack.env), sizes, rng, result))
    result.elapsed_s = time.monotonic() - started
    return result
