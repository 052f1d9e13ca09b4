"""Figure 18: thread hops per run of the worker's graph (issue 33, part 3), counted, not timed.

Every hop hands work to another thread and back (a queue put, a wake-up of the event loop
through its self-pipe): the profile of figure 17 shows the worker's event loop thread
losing the CPU at each one. Counted in this process on the worker's own graph
(``worker.agent.graph.build_graph``), its ledger (``worker.tools.ledger.calls.Ledger``) and its saver
(``shared.storage.sqlite_saver.OneHopSaver``), beside the same runs with LangGraph's own
``AsyncSqliteSaver`` (the floor's), on a file opened like the worker's
(``shared.storage.sqlite.connect``: WAL, ``synchronous=FULL``); a scripted model without
streaming (one tool call, then an answer) and an in-process tool, so what is counted is
the graph's and the database's own hops. Counted: work sent to the event loop's default thread pool
(``ThreadPoolExecutor.submit``) and calls into aiosqlite's connection thread, by
aiosqlite method. The counts do not depend on the machine's load.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import random
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiosqlite
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import StructuredTool
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from bench.stats import percentile as _p
from shared.storage.sqlite import SqliteDatabase, connect
from shared.storage.sqlite_saver import OneHopSaver
from worker.agent.graph import build_graph
from worker.tools.ledger.calls import Ledger

HEADING = "## Thread hops per run (figure 18)"


class _Scripted(BaseChatModel):
    """Answers from a list, without streaming: the model's own hops are not counted."""

    answers: Any

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=next(self.answers))])

    async def _agenerate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                         **kwargs: Any) -> ChatResult:
        return self._generate(messages)


@dataclass(frozen=True)
class Timing:
    #: per run, ms: wall time of ``astream`` to its end, and this process's CPU over it
    wall_ms: list[float]
    cpu_ms: list[float]


@dataclass
class Hops:
    runs: int
    #: what was counted -> calls per run, with the worker's saver
    per_run: dict[str, float] = field(default_factory=dict)
    #: the same with LangGraph's own AsyncSqliteSaver (the floor's)
    stock: dict[str, float] = field(default_factory=dict)
    #: runs of each saver timed, and their timings (the worker's saver, LangGraph's)
    timed: int = 0
    timing: tuple[Timing, Timing] | None = None
    elapsed_s: float = 0.0


@contextlib.contextmanager
def _counting(counts: collections.Counter[str]) -> Iterator[None]:
    submit = concurrent.futures.ThreadPoolExecutor.submit
    execute = aiosqlite.Connection._execute

    def counted_submit(self: Any, *args: Any, **kwargs: Any) -> Any:
        counts["thread pool (ThreadPoolExecutor.submit)"] += 1
        return submit(self, *args, **kwargs)

    async def counted_execute(self: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
        counts[f"aiosqlite `{getattr(fn, '__name__', 'call')}`"] += 1
        return await execute(self, fn, *args, **kwargs)

    concurrent.futures.ThreadPoolExecutor.submit = counted_submit  # type: ignore[method-assign, assignment]
    aiosqlite.Connection._execute = counted_execute  # type: ignore[method-assign]
    try:
        yield
    finally:
        concurrent.futures.ThreadPoolExecutor.submit = submit  # type: ignore[method-assign]
        aiosqlite.Connection._execute = execute  # type: ignore[method-assign]


@contextlib.asynccontextmanager
async def _graph(root: Path, runs: int, saver_class: type[AsyncSqliteSaver]) -> AsyncIterator[_Runner]:
    """The worker's graph, ledger and ``saver_class`` on a file of their own, with ``runs`` answers."""
    async def echo(text: str) -> str:
        return text

    tool = StructuredTool.from_function(coroutine=echo, name="tools__echo", description="echo")
    answers = []
    for i in range(runs):
        call = {"name": "tools__echo", "args": {"text": "durable"}, "id": f"call-{i}", "type": "tool_call"}
        answers += [AIMessage("", tool_calls=[call]), AIMessage("durable")]
    db = await SqliteDatabase.open(root / "sophos.db")
    conn = await connect(root / "sophos.db")
    try:
        saver = saver_class(conn)
        await saver.setup()
        graph = build_graph(
            model=_Scripted(answers=iter(answers)), tools=lambda: [tool], system_prompt=lambda: "",
            checkpointer=saver, ledger=Ledger(db),
        )
        conversations = [str(uuid.uuid4()) for _ in range(runs)]
        async with db.transaction() as tx:
            for conversation in conversations:
                await tx.execute(
                    "INSERT INTO conversations (id, title, created_at, updated_at) VALUES (?, 't', 'x', 'x')",
                    (conversation,),
                )
        yield _Runner(graph, iter(conversations))
    finally:
        await conn.close()
        await db.close()


@dataclass
class _Runner:
    graph: Any
    conversations: Iterator[str]

    async def run(self) -> None:
        conversation = next(self.conversations)
        config: Any = {"configurable": {"thread_id": conversation}, "metadata": {"run_id": conversation}}
        async for _ in self.graph.astream(
            {"messages": [HumanMessage("hello")]}, config, stream_mode=["messages", "tasks"],
            durability="sync",
        ):
            pass


async def _count(root: Path, runs: int, saver_class: type[AsyncSqliteSaver]) -> dict[str, float]:
    counts: collections.Counter[str] = collections.Counter()
    async with _graph(root, runs, saver_class) as runner:
        with _counting(counts):
            for _ in range(runs):
                await runner.run()
    return {name: n / runs for name, n in counts.most_common()}


async def _time(root: Path, runs: int) -> tuple[Timing, Timing]:
    """Runs with either saver in one random order: wall time and this process's CPU, per run."""
    order = ["worker"] * runs + ["stock"] * runs
    random.Random(0).shuffle(order)
    samples: dict[str, tuple[list[float], list[float]]] = {"worker": ([], []), "stock": ([], [])}
    async with (
        _graph(root / "timed-worker", runs, OneHopSaver) as worker,
        _graph(root / "timed-stock", runs, AsyncSqliteSaver) as stock,
    ):
        runners = {"worker": worker, "stock": stock}
        for arm in order:
            wall, cpu = time.perf_counter(), time.process_time()
            await runners[arm].run()
            samples[arm][0].append((time.perf_counter() - wall) * 1000)
            samples[arm][1].append((time.process_time() - cpu) * 1000)
    return Timing(*samples["worker"]), Timing(*samples["stock"])


def measure(*, quick: bool) -> Hops:
    """Figure 18: count the hops of ``runs`` runs with either saver, then time them interleaved."""
    started = time.monotonic()
    runs = 5 if quick else 50
    timed = 10 if quick else 200
    with tempfile.TemporaryDirectory(prefix="sophos-hops-") as root:
        per_run = asyncio.run(_count(Path(root) / "worker", runs, OneHopSaver))
        stock = asyncio.run(_count(Path(root) / "stock", runs, AsyncSqliteSaver))
        timing = asyncio.run(_time(Path(root), timed))
    return Hops(
        runs=runs, per_run=per_run, stock=stock, timed=timed, timing=timing,
        elapsed_s=time.monotonic() - started,
    )


def section(h: Hops, *, command: str = "", code: str = "", date: str = "") -> str:
    """Markdown: hops per run, by kind, and their total."""
    lines = [
        "| hop | per run, the worker's saver | per run, LangGraph's `AsyncSqliteSaver` |",
        "|---|---:|---:|",
    ]
    names = list(dict.fromkeys([*h.per_run, *h.stock]))
    lines += [f"| {name} | {h.per_run.get(name, 0):.2f} | {h.stock.get(name, 0):.2f} |" for name in names]
    lines.append(f"| **total** | **{sum(h.per_run.values()):.2f}** | **{sum(h.stock.values()):.2f}** |")
    timed = ""
    if h.timing is not None:
        ours, stock = h.timing
        rows = [
            "| per run, p50 / p95 | the worker's saver | LangGraph's `AsyncSqliteSaver` | ratio, p50s |",
            "|---|---:|---:|---:|",
        ]
        for label, mine, theirs in (("wall time of `astream`, ms", ours.wall_ms, stock.wall_ms),
                                    ("CPU of the process, ms", ours.cpu_ms, stock.cpu_ms)):
            rows.append(
                f"| {label} | {_p(mine, 50):.2f} / {_p(mine, 95):.2f} "
                f"| {_p(theirs, 50):.2f} / {_p(theirs, 95):.2f} | {_p(mine, 50) / _p(theirs, 50):.2f}× |"
            )
        timed = (
            f"\nThe same runs timed: {h.timed} with each saver on files of their own, in one random order "
            "(wall time and `time.process_time()` of this process, every thread):\n\n"
            + "\n".join(rows) + "\n"
        )
    return (
        f"{HEADING}\n\n"
        f"{h.runs} runs of the worker's graph in process (one tool call, then the answer; the ledger and "
        "the worker's saver, `OneHopSaver`, on a WAL file, `durability=\"sync\"`), and as many with "
        "LangGraph's own `AsyncSqliteSaver` (the floor's) instead, each hop a handing of work to another "
        "thread: calls into aiosqlite's connection thread by method (`put`, `put_writes`, `get_tuple`: "
        "one call of the worker's saver), and work sent to the default thread pool. Counted, so the "
        "machine's load does not matter.\n\n"
        + (f"Measured by `{command}` on {date} (code {code}).\n\n" if command else "")
        + "\n".join(lines) + "\n" + timed
    )

