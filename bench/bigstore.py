"""A big store: a database filled with N conversations as the worker fills it (issue 44, part 1).

Each conversation is ``TURNS`` runs of one user message and one answer (``2 * TURNS`` stored
messages), written through the storage interface the worker writes with:

- its rows by the worker's own :class:`worker.store.RunStore` (``start_run``, then
  ``finish_run`` with the thread's shape), the same SQL on either engine;
- its thread as LangGraph checkpoints through LangGraph's saver for the engine (the SQLite saver
  the worker uses; on PostgreSQL LangGraph's own saver, the worker's fenced saver without the
  lease check, which only guards a live run): one template thread is made
  once by running a graph of the agent's shape (``shared/storage/threads/state.py``'s state, a
  DeltaChannel of messages) turn by turn, then every conversation gets its checkpoints and
  task writes, each put under the conversation's own thread and run ids.

Fast because it is batched: the rows of ``BATCH`` conversations are one transaction (the
store's transactions join the batch's: :class:`Batched`), and so are their checkpoints. Rates
are measured (``Filled.rate``). ``python -m bench.bigstore sqlite PATH N`` or ``postgres URL N``
fills one from the command line.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from shared.contracts.jobs import JobKind, RunJob
from shared.contracts.runs import RunStatus
from shared.storage import Database, Tx

#: runs per conversation: each one user message and one answer
TURNS = 5
#: conversations written per transaction
BATCH = 500


class Batched:
    """A :class:`shared.storage.Database` whose transactions join the one :meth:`batch` holds open:
    the worker's store writes as it always does, and a batch of its writes commits once."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.dialect = db.dialect
        self.leases = db.leases
        self._tx: Tx | None = None

    @asynccontextmanager
    async def batch(self) -> AsyncIterator[None]:
        async with self.db.transaction() as tx:
            self._tx = tx
            try:
                yield
            finally:
                self._tx = None

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Tx]:
        if self._tx is None:
            async with self.db.transaction() as tx:
                yield tx
        else:
            yield self._tx

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        if self._tx is not None:
            return await self._tx.fetchall(sql, params)
        return await self.db.fetchall(sql, params)

    async def close(self) -> None:
        await self.db.close()


@dataclass(frozen=True, slots=True)
class Step:
    """One checkpoint of the template thread, as the saver is given it, with its task writes."""

    checkpoint: dict[str, Any]
    metadata: dict[str, Any]
    new_versions: dict[str, Any]
    parent: str | None
    turn: int
    writes: tuple[tuple[str, str, tuple[tuple[str, Any], ...]], ...]


def template(turns: int = TURNS) -> list[Step]:
    """A thread of ``turns`` runs, made by running a graph of the agent's state and entry (START →
    agent → END, the agent answering at once) on LangGraph's in-memory saver, read back oldest
    first: what each checkpoint put, with the channel versions it changed and its tasks' writes."""
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import END, START, StateGraph

    from shared.contracts.runs import AGENT
    from shared.storage.threads.state import AgentState

    def agent(state: AgentState) -> dict[str, Any]:
        asked = state["messages"][-1].content
        return {"messages": [AIMessage(content=f"An answer to {asked!s}, in a few plain sentences.")]}

    graph = StateGraph(AgentState)
    graph.add_node(AGENT, agent)
    graph.add_edge(START, AGENT)
    graph.add_edge(AGENT, END)
    saver = InMemorySaver()
    compiled = graph.compile(checkpointer=saver)
    thread = "template"
    for turn in range(turns):
        run = {"run_id": f"run-{turn}"}
        config: RunnableConfig = {"configurable": {"thread_id": thread}, "metadata": run}
        asked: Any = {"messages": [HumanMessage(content=f"Question {turn}: what is worth knowing here?")]}
        compiled.invoke(asked, config, durability="sync")
    tuples = list(reversed(list(saver.list({"configurable": {"thread_id": thread}}))))
    steps: list[Step] = []
    before: dict[str, Any] = {}
    for t in tuples:
        versions = dict(t.checkpoint["channel_versions"])
        changed = {c: v for c, v in versions.items() if before.get(c) != v}
        before = versions
        by_task: dict[tuple[str, str], list[tuple[str, Any]]] = {}
        for task_id, channel, value in t.pending_writes or []:
            by_task.setdefault((task_id, ""), []).append((channel, value))
        run_id = str((t.metadata or {}).get("run_id", "run-0"))
        steps.append(Step(
            checkpoint=dict(t.checkpoint), metadata=dict(t.metadata or {}), new_versions=changed,
            parent=t.parent_config["configurable"]["checkpoint_id"] if t.parent_config else None,
            turn=int(run_id.rsplit("-", 1)[1]),
            writes=tuple((task, path, tuple(w)) for (task, path), w in by_task.items()),
        ))
    return steps


@dataclass
class Filled:
    engine: str
    conversations: int
    runs: int
    checkpoints: int
    seconds: float

    @property
    def rate(self) -> float:
        """Conversations written per second."""
        return self.conversations / self.seconds if self.seconds else float("nan")


def _iso(at: float) -> str:
    from api.http.timefmt import iso_from_timestamp

    return iso_from_timestamp(at)


async def _rows(store: Any, conversation: str, runs: list[str], start: float, owner: str) -> None:
    """The conversation's rows, run by run, as the worker records them."""
    for turn, run_id in enumerate(runs):
        job = RunJob(
            run_id=run_id, conversation_id=conversation, kind=JobKind.RUN,
            message=f"Conversation {conversation[:8]} question {turn}: what is worth knowing here?",
            enqueued_at=start + turn, new_conversation=turn == 0, owner=owner,
        )
        await store.start_run(job)
        await store.finish_run(
            run_id, conversation, status=RunStatus.COMPLETED, message_count=2 * (turn + 1),
            pending_tasks=False, step_count=1,
        )


async def _thread(saver: Any, steps: list[Step], conversation: str, runs: list[str]) -> None:
    """The conversation's checkpoints and task writes, oldest first, under its own ids."""
    for step in steps:
        config: dict[str, Any] = {"configurable": {"thread_id": conversation, "checkpoint_ns": ""}}
        if step.parent is not None:
            config["configurable"]["checkpoint_id"] = step.parent
        metadata = {**step.metadata, "run_id": runs[step.turn]}
        stored = await saver.aput(config, step.checkpoint, metadata, step.new_versions)
        for task_id, path, writes in step.writes:
            await saver.aput_writes(stored, list(writes), task_id, path)


#: writers at once on PostgreSQL (each its own connections); SQLite has one writer
POSTGRES_WRITERS = 8


async def fill(
    settings: Any, conversations: int, *, owner: str = "local", batch: int = BATCH,
    steps: list[Step] | None = None, say: Any = None,
) -> Filled:
    """Write ``conversations`` conversations into the database ``settings`` names (migrated
    first); return what was written and how fast. On PostgreSQL ``POSTGRES_WRITERS`` write at
    once, a batch each (each batch one transaction for its rows and one for its threads)."""
    steps = steps if steps is not None else template()
    turns = max(step.turn for step in steps) + 1
    started = time.perf_counter()
    await _migrate(settings)
    base = time.time() - 86400 * 30
    batches = iter(range(0, conversations, batch))
    done = 0

    async def writer() -> None:
        nonlocal done
        from worker.store import RunStore

        db = Batched(await _open_database(settings))
        store = RunStore(db)
        try:
            async with _saver(settings) as (saver, commit):
                for first in batches:
                    n = min(batch, conversations - first)
                    made = [(str(uuid.uuid4()), [str(uuid.uuid4()) for _ in range(turns)]) for _ in range(n)]
                    # The rows, then the threads: on SQLite each is a writer of its own, in turn.
                    async with db.batch():
                        for i, (conversation, runs) in enumerate(made):
                            await _rows(store, conversation, runs, base + (first + i) * 0.01, owner)
                    for conversation, runs in made:
                        await _thread(saver, steps, conversation, runs)
                    await commit()
                    done += n
                    if say is not None and (first // batch) % 20 == 19:
                        say(f"  {done} conversations, {done / (time.perf_counter() - started):.0f}/s")
        finally:
            await db.close()

    writers = POSTGRES_WRITERS if settings.database_url is not None else 1
    await asyncio.gather(*(writer() for _ in range(writers)))
    return Filled(
        engine="postgres" if settings.database_url else "sqlite", conversations=conversations,
        runs=conversations * turns, checkpoints=conversations * len(steps),
        seconds=time.perf_counter() - started,
    )


async def _migrate(settings: Any) -> None:
    """The application tables and the saver's, made once before the writers start."""
    if settings.database_url is not None:
        from shared.storage.postgres import migrate

        await migrate(settings.database_url)
    db = await _open_database(settings)
    await db.close()
    async with _saver(settings):
        pass


async def _open_database(settings: Any) -> Database:
    from shared.storage.engines import open_database

    return await open_database(settings, max_size=1)


@asynccontextmanager
async def _saver(settings: Any) -> AsyncIterator[tuple[Any, Any]]:
    """The engine's saver, set up, and how to commit what it was given since the last call."""
    if settings.database_url is None:
        import sqlite3
        from collections.abc import Iterator
        from contextlib import contextmanager

        from langgraph.checkpoint.sqlite import SqliteSaver

        class BatchSaver(SqliteSaver):
            """LangGraph's SqliteSaver (the worker's, shared/storage/sqlite_saver.py), its writes
            left uncommitted until the batch's one commit."""

            @contextmanager
            def cursor(self, transaction: bool = True) -> Iterator[sqlite3.Cursor]:
                with super().cursor(transaction=False) as cur:
                    yield cur

        raw = sqlite3.connect(settings.database_path, check_same_thread=False)
        raw.execute("PRAGMA synchronous=NORMAL")
        sync = BatchSaver(raw)
        sync.setup()

        class _Saver:
            async def aput(self, *args: Any) -> Any:
                return sync.put(*args)

            async def aput_writes(self, *args: Any) -> Any:
                return sync.put_writes(*args)

        async def commit() -> None:
            raw.commit()

        try:
            yield _Saver(), commit
        finally:
            raw.close()
        return
    import psycopg
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg.rows import dict_row

    conn = await psycopg.AsyncConnection.connect(
        settings.database_url, autocommit=True, prepare_threshold=0, row_factory=dict_row
    )
    try:
        await AsyncPostgresSaver(conn).setup()
        await conn.set_autocommit(False)  # the batch's writes, one commit
        yield AsyncPostgresSaver(conn), conn.commit
    finally:
        await conn.close()


def settings_for(engine: str, where: str) -> Any:
    """Settings naming a SQLite file or a PostgreSQL URL (the rest as defaults)."""
    from shared.settings import Settings

    env = {"DATABASE_PATH": where} if engine == "sqlite" else {"DATABASE_URL": where}
    return replace(Settings.from_env(env))


def main(argv: list[str]) -> None:
    engine, where, n = argv[0], argv[1], int(argv[2])
    if engine == "sqlite":
        Path(where).parent.mkdir(parents=True, exist_ok=True)
    filled = asyncio.run(fill(settings_for(engine, where), n, say=print))
    print(f"{filled.engine}: {filled.conversations} conversations, {filled.runs} runs, "
          f"{filled.checkpoints} checkpoints in {filled.seconds:.1f} s ({filled.rate:.0f}/s)")


if __name__ == "__main__":
    main(sys.argv[1:])
