"""A thread's state read without LangGraph's graph runtime (shared/storage/threads/snapshot.py) is the
state LangGraph's own graph reads (issue 45, part 3).

No process: the real agent graph (worker/agent/graph.py) with a scripted model writes threads
to a SQLite file, as the worker does; each is then read as a reader process reads it (the sync
saver, the strict serializer) both ways: through :class:`ThreadStates` and through the compiled
reader graph (shared/storage/threads/state.py), the latter with LangGraph's own serializer.
Every checkpoint of every thread, its head, its whole history and a page of it must give the
same snapshot: values, next, tasks (ids, errors, interrupts, results), configs, metadata; ours
with the stand-ins of LangGraph's types (shared/storage/threads/stand_ins.py), theirs with
LangGraph's.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import StructuredTool
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.types import Command

from api.store import READER_MODULES
from shared.contracts.codec import encode
from shared.contracts.jobs import Decision, DecisionAction
from shared.storage.threads.branch import thread_at
from shared.storage.threads.decoding import DecodedOnce
from shared.storage.threads.history import states
from shared.storage.threads.interrupts import interrupt_requests
from shared.storage.threads.snapshot import CHANNELS, NODES, ThreadStates
from shared.storage.threads.stand_ins import Interrupt, Send
from shared.storage.threads.state import reader_graph
from tests.support.client import wait_for_async
from worker.agent.graph import build_graph


class _Scripted(GenericFakeChatModel):
    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def _calls(*names: str, turn: int = 0) -> list[dict[str, Any]]:
    return [
        {"name": name, "args": {"a": i, "b": turn}, "id": f"call-{turn}-{i}", "type": "tool_call"}
        for i, name in enumerate(names)
    ]


async def _add(a: int, b: int) -> str:
    return str(a + b)


async def _broken(a: int, b: int) -> str:
    raise RuntimeError("the tool broke")


class _Threads:
    """Threads written by the real graph, each a shape the reads must know."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.held = asyncio.Event()
        self.release = asyncio.Event()

    async def _hangs(self, a: int, b: int) -> str:
        self.held.set()
        await self.release.wait()
        return "late"

    def _graph(self, saver: Any, replies: list[AIMessage], approve: bool = False) -> Any:
        tools = [
            StructuredTool.from_function(coroutine=_add, name="add", description="adds"),
            StructuredTool.from_function(coroutine=_broken, name="broken", description="fails"),
            StructuredTool.from_function(coroutine=self._hangs, name="hangs", description="waits"),
        ]
        return build_graph(
            model=_Scripted(messages=iter(replies)), tools=tools, system_prompt=lambda: "",
            checkpointer=saver, needs_approval=(lambda tool: approve and tool == "add"),
        )

    @staticmethod
    def _config(thread: str, run: str, checkpoint_id: str | None = None) -> dict[str, Any]:
        configurable: dict[str, Any] = {"thread_id": thread}
        if checkpoint_id is not None:
            configurable["checkpoint_id"] = checkpoint_id
        return {"configurable": configurable, "metadata": {"run_id": run}}

    async def _run(self, graph: Any, payload: Any, config: dict[str, Any]) -> None:
        with contextlib.suppress(Exception):  # a failing step is one of the shapes
            async for _ in graph.astream(payload, config, durability="sync"):
                pass

    async def write(self) -> list[str]:
        async with AsyncSqliteSaver.from_conn_string(str(self.path)) as saver:
            await self._plain(saver)
            await self._long(saver)
            await self._approvals(saver)
            await self._cut(saver)
            await self._fork_and_update(saver)
        return ["plain", "long", "waiting", "approved", "rejected", "cut"]

    async def _plain(self, saver: Any) -> None:
        """A plain answer; then tool calls, one of which fails."""
        replies = [AIMessage("hello"), AIMessage("", tool_calls=_calls("add", "broken")), AIMessage("done")]
        g = self._graph(saver, replies)
        await self._run(g, {"messages": [HumanMessage("hi")]}, self._config("plain", "r1"))
        await self._run(g, {"messages": [HumanMessage("add")]}, self._config("plain", "r2"))

    async def _long(self, saver: Any) -> None:
        """Enough turns that the messages' DeltaChannel stores a full copy on the way (100 updates)."""
        replies: list[AIMessage] = []
        for turn in range(27):
            replies += [AIMessage("", tool_calls=_calls("add", "add", turn=turn)), AIMessage(f"sum {turn}")]
        g = self._graph(saver, replies)
        for turn in range(27):
            await self._run(g, {"messages": [HumanMessage(f"turn {turn}")]}, self._config("long", f"l{turn}"))

    async def _approvals(self, saver: Any) -> None:
        """Approvals: one left waiting, one approved, one rejected."""
        for thread, action in (
            ("waiting", None), ("approved", DecisionAction.APPROVE), ("rejected", DecisionAction.REJECT),
        ):
            replies = [AIMessage("", tool_calls=_calls("add", "add")), AIMessage("ok")]
            g = self._graph(saver, replies, approve=True)
            await self._run(g, {"messages": [HumanMessage("add twice")]}, self._config(thread, "a1"))
            if action is None:
                continue
            state = await g.aget_state(self._config(thread, "a2"))
            requests = interrupt_requests(state) or []
            decisions = [encode(Decision(r["id"], action, message="no")) for r in requests]
            resume = Command(resume={i.id: decisions for i in state.interrupts})
            await self._run(g, resume, self._config(thread, "a2"))

    async def _cut(self, saver: Any) -> None:
        """Cut mid-step: one call answered, the other still running when the run is cancelled."""
        g = self._graph(saver, [AIMessage("", tool_calls=_calls("add", "hangs")), AIMessage("after")])
        config = self._config("cut", "c1")
        run = asyncio.create_task(self._run(g, {"messages": [HumanMessage("cut")]}, config))
        await self.held.wait()

        async def answered() -> bool:
            saved = await saver.aget_tuple(config)
            return any(w[1] == "messages" for w in saved.pending_writes or [])

        await wait_for_async(answered, timeout=30, interval=0.01, message="the first call's answer saved")
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run

    async def _fork_and_update(self, saver: Any) -> None:
        """A fork from the first answer, and a state updated by hand."""
        first = [c async for c in saver.alist(thread_at("plain"))][-2].config["configurable"]["checkpoint_id"]
        g = self._graph(saver, [AIMessage("forked")])
        await self._run(g, {"messages": [HumanMessage("again")]}, self._config("plain", "r3", first))
        update = {"messages": [AIMessage("edited", id="e1")]}
        await g.aupdate_state(self._config("plain", "r4"), update, as_node="agent")


def _plain(value: Any) -> Any:
    """A snapshot with its errors as their reprs (exceptions compare by identity), its Sends and
    Interrupts as their fields (a stand-in's or LangGraph's), its NamedTuples as tuples."""
    if isinstance(value, BaseException):
        return repr(value)
    kind = type(value).__name__
    if kind == "Interrupt":
        return (kind, _plain(value.value), value.id, value.response_schema)
    if kind == "Send":
        return (kind, value.node, _plain(value.arg), value.timeout)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return tuple(_plain(v) for v in value)
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    return value


class _Ours(ThreadStates):
    """ThreadStates that may not hand a checkpoint to LangGraph's graph: every one is its own."""

    def _graph(self) -> Any:
        raise AssertionError("a checkpoint of the agent's threads was read by LangGraph's graph")


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    path = tmp_path_factory.mktemp("snapshot") / "threads.db"
    return path, asyncio.run(_Threads(path).write())


@pytest.fixture(scope="module")
def saver(database: tuple[Path, list[str]]) -> Iterator[SqliteSaver]:
    conn = sqlite3.connect(f"{database[0].as_uri()}?mode=ro", uri=True, check_same_thread=False)
    yield SqliteSaver(conn, serde=DecodedOnce())
    conn.close()


def _langgraphs(saver: SqliteSaver) -> SqliteSaver:
    """The same connection with LangGraph's own strict serializer: its types, for its graph."""
    return SqliteSaver(saver.conn, serde=JsonPlusSerializer(allowed_msgpack_modules=None))


def _history_page(history: list[Any], name: str) -> dict[str, Any]:
    middle = history[len(history) // 2].config["configurable"]["checkpoint_id"]
    run_id = history[0].metadata.get("run_id")
    return {"before": thread_at(name, middle), "limit": 3, "filter": {"run_id": run_id}}


def test_every_checkpoint_reads_as_langgraph_reads_it(
    database: tuple[Path, list[str]], saver: SqliteSaver
) -> None:
    ours, theirs = _Ours(saver), reader_graph(_langgraphs(saver))
    seen_tasks = seen_interrupts = seen_errors = 0
    stand_ins: set[type] = set()
    for name in database[1]:
        head = {"configurable": {"thread_id": name}}
        assert _plain(ours.get_state(head)) == _plain(theirs.get_state(head)), name
        history = list(theirs.get_state_history(thread_at(name)))
        mine = list(ours.get_state_history(thread_at(name)))
        assert _plain(mine) == _plain(history), name
        stand_ins |= {type(i) for state in mine for task in state.tasks for i in task.interrupts}
        stand_ins |= {
            type(p) for c in saver.list(thread_at(name))
            for p in c.checkpoint["channel_values"].get("__pregel_tasks") or ()
        }
        for state in history:
            at = thread_at(name, state.config["configurable"]["checkpoint_id"])
            assert _plain(ours.get_state(at)) == _plain(theirs.get_state(at)), (name, at)
            seen_tasks += len(state.tasks)
            seen_interrupts += sum(len(t.interrupts) for t in state.tasks)
            seen_errors += sum(t.error is not None for t in state.tasks)
        # A page at a time through the saver's view that rebuilds each from its child's (an export).
        assert _plain(list(states(ours, thread_at(name), page=5))) == _plain(history), name
        page = _history_page(history, name)
        assert _plain(list(ours.get_state_history(thread_at(name), **page))) == _plain(
            list(theirs.get_state_history(thread_at(name), **page))
        )
    # The threads had what the comparison is about: tasks, interrupts, an error (the cut run's
    # cancelled call), a full copy of the messages (so later ones replay writes since it).
    seeds = sum("messages" in c.checkpoint["channel_values"] for c in saver.list(thread_at("long")))
    assert seen_tasks > 100 and seen_interrupts >= 3 and seen_errors >= 1 and seeds >= 1, (
        seen_tasks, seen_interrupts, seen_errors, seeds,
    )
    assert ours.get_state(thread_at("cut")).next == ("tools",)  # the call still running, the other done
    # Ours read LangGraph's types as the stand-ins, which import nothing (stand_ins.py).
    assert stand_ins == {Interrupt, Send}, stand_ins


def test_a_thread_without_checkpoints_reads_as_langgraph_reads_it(saver: SqliteSaver) -> None:
    head = {"configurable": {"thread_id": "nobody"}}
    assert _Ours(saver).get_state(head) == reader_graph(_langgraphs(saver)).get_state(head)
    assert list(_Ours(saver).get_state_history(thread_at("nobody"))) == []


def test_the_graph_has_the_shape_the_reads_know() -> None:
    """The nodes, their triggers and the channels of the reader graph (the worker's shape,
    tests/test_storage.py) are the ones shared/storage/threads/snapshot.py rebuilds states for."""
    from langgraph.checkpoint.memory import InMemorySaver

    graph = reader_graph(InMemorySaver())
    assert {name: list(node.triggers) for name, node in graph.nodes.items()} == {
        name: [trigger] for name, trigger in NODES.items()
    }
    assert list(graph.nodes) == list(NODES)
    assert set(graph.channels) == set(CHANNELS)
    assert graph.stream_channels_asis == ["messages"]


#: Run in a fresh interpreter, as a reader process: its modules (the first argument, named by
#: api/store.py, which a reader does not import), then every read the API sends, on every thread;
#: then what it had loaded when ready, and after the reads.
_READS = """
import functools, sys
import api.http.reader_process
for module in sys.argv[1].split(","):
    __import__(module)
preloaded = sorted(sys.modules)
from api.chat import approvals, branches
from api.protocol.runs import fork_reads
from api.protocol.threads import state
from api.thread_read import read_thread
from shared.storage.threads.source import ThreadSource
source = ThreadSource("sqlite", sys.argv[2])
reads = [
    functools.partial(branches.current, False), functools.partial(branches.lines, True),
    approvals.pending_requests, state.thread_state, functools.partial(state.thread_history, 10, None, None),
    state.pending_of, functools.partial(fork_reads.run_started, "a1"),
]
for thread in sys.argv[3:]:
    for read in reads:
        read_thread(source, thread, read, {"configurable": {"thread_id": thread}})
print([preloaded, sorted(sys.modules)])
"""


#: PostgreSQL's saver and its driver (~7 MB a process: bench figure 16)
_POSTGRES = ("psycopg", "langgraph.checkpoint.postgres")
#: ``langgraph.types`` and what it brings with ``langchain_core.runnables``: langchain's tracers,
#: langsmith's client, OpenTelemetry's SDK (~18 MB a reader: bench figure 16). A reader decodes a
#: tool call's Send and an approval's Interrupt as stand-ins (shared/storage/threads/stand_ins.py).
_RUNNABLES = (
    "langgraph.types", "langchain_core.runnables.base", "langchain_core.tracers", "langsmith",
    "opentelemetry",
)


def test_reading_threads_loads_no_graph_runtime(database: tuple[Path, list[str]]) -> None:
    """A reader's modules and every read it is sent, on every thread: no ``langgraph.graph`` nor
    ``langgraph.pregel`` (~30 MB and a third of a second a reader: bench figure 16), nor
    ``langgraph.types`` and langsmith with it (~18 MB); nor, in a reader at rest, what only
    another path runs."""
    path, names = database
    loaded = subprocess.run(
        [sys.executable, "-c", _READS, ",".join(READER_MODULES), f"{path.as_uri()}?mode=ro",
         *(n for n in names if n != "long")],
        capture_output=True, text=True, check=True,
    ).stdout
    preloaded, after_reads = eval(loaded)  # noqa: S307
    found = [m for m in after_reads if m.startswith(("langgraph.graph", "langgraph.pregel", *_RUNNABLES))]
    assert not found, found
    # Nor, once started, the settings (~1.3 MB: what shared.users brings), nor PostgreSQL's saver
    # and psycopg on SQLite: neither is read with.
    settings = ("shared.settings", "shared.settings_parsing", "shared.users")
    found = [m for m in preloaded if m in settings or m.startswith(_POSTGRES)]
    assert not found, found


def test_a_thread_of_the_version_before_reads_as_langgraph_reads_it(tmp_path: Path) -> None:
    """tests/fixtures/pre-delta.db (scripts/make_fixture_db.py): every message in every checkpoint,
    as the plain ``add_messages`` channel stored them before the DeltaChannel. A copy: the saver
    sets the file up (WAL) on first use, as the worker does before any reader reads."""
    path = tmp_path / "pre-delta.db"
    shutil.copyfile(Path(__file__).resolve().parents[1] / "fixtures" / "pre-delta.db", path)
    conn = sqlite3.connect(path, check_same_thread=False)
    with contextlib.closing(conn):
        saver = SqliteSaver(conn, serde=DecodedOnce())
        names = [row[0] for row in conn.execute("SELECT DISTINCT thread_id FROM checkpoints")]
        assert len(names) >= 3
        ours, theirs = _Ours(saver), reader_graph(_langgraphs(saver))
        for name in names:
            head = {"configurable": {"thread_id": name}}
            assert _plain(ours.get_state(head)) == _plain(theirs.get_state(head)), name
            history = list(theirs.get_state_history(thread_at(name)))
            assert _plain(list(ours.get_state_history(thread_at(name)))) == _plain(history), name


def test_a_checkpoint_it_does_not_know_is_read_by_langgraphs_graph(
    database: tuple[Path, list[str]], tmp_path: Path
) -> None:
    """A checkpoint with a channel the agent's graph does not have (another graph's, a later
    LangGraph's) is not guessed at: LangGraph's own graph reads it, head and history alike."""
    path = tmp_path / "copy.db"
    shutil.copyfile(database[0], path)
    conn = sqlite3.connect(path, check_same_thread=False)
    with contextlib.closing(conn):
        saver = SqliteSaver(conn, serde=DecodedOnce())
        saved = saver.get_tuple({"configurable": {"thread_id": "approved"}})
        assert saved is not None
        checkpoint = {**saved.checkpoint, "id": "1f0c0000-0000-6000-8000-000000000001"}
        checkpoint["channel_values"] = {**checkpoint["channel_values"], "elsewhere": 1}
        checkpoint["channel_versions"] = {**checkpoint["channel_versions"], "elsewhere": 1}
        saver.put({"configurable": {"thread_id": "odd", "checkpoint_ns": ""}}, checkpoint, saved.metadata, {})
        asked: list[str] = []

        class Counted(ThreadStates):
            def _graph(self) -> Any:
                asked.append("graph")
                return super()._graph()

        ours, theirs = Counted(saver), reader_graph(_langgraphs(saver))
        head = {"configurable": {"thread_id": "odd"}}
        assert _plain(ours.get_state(head)) == _plain(theirs.get_state(head))
        assert _plain(list(ours.get_state_history(thread_at("odd")))) == _plain(
            list(theirs.get_state_history(thread_at("odd")))
        )
        assert asked == ["graph", "graph"]


def test_a_reader_decodes_sends_and_interrupts_as_stand_ins_and_gives_langgraph_its_own() -> None:
    """The reader's serializer: a Send and an Interrupt as the stand-ins (at any depth), anything
    else of LangGraph's as LangGraph's; :func:`as_langgraph` gives back what was written."""
    from datetime import timedelta

    from langgraph import types

    from shared.storage.threads.stand_ins import as_langgraph

    approval = types.Interrupt({"requests": [{"id": "c1"}]}, "i-1")
    written = [
        types.Send("tools", {"id": "c1", "args": {"a": 1}}), approval,
        {"nested": [types.Send("tools", [approval])]}, types.Overwrite([HumanMessage("x", id="1")]),
        types.Send("agent", {}, timeout=timedelta(seconds=3)),
    ]
    decoded = DecodedOnce().loads_typed(JsonPlusSerializer(allowed_msgpack_modules=None).dumps_typed(written))
    assert [type(v) for v in decoded] == [Send, Interrupt, dict, types.Overwrite, Send]
    assert type(decoded[2]["nested"][0]) is Send and type(decoded[2]["nested"][0].arg[0]) is Interrupt
    assert (decoded[1].value, decoded[1].id) == ({"requests": [{"id": "c1"}]}, "i-1")
    assert [repr(v) for v in decoded[:2]] == [repr(v) for v in written[:2]]
    assert type(decoded[4].timeout) is types.TimeoutPolicy  # LangGraph's, decoded by LangGraph
    back = as_langgraph(decoded)
    assert back == written and [type(v) for v in back] == [type(v) for v in written]


def test_a_steps_writes_and_the_writes_since_a_copy_apply_as_the_delta_channel_applies_them() -> None:
    """One step's writes (``DeltaChannel.update``) and a replay since a full copy
    (``DeltaChannel.replay_writes``), an Overwrite among them or not."""
    from langgraph.channels.delta import DeltaChannel
    from langgraph.types import Overwrite

    from shared.compat import messages_delta_reducer
    from shared.storage.threads.snapshot import _apply, _reduce

    base = [HumanMessage("a", id="1")]
    for writes in (
        [[AIMessage("b", id="2")], [HumanMessage("a2", id="1")]],
        [[AIMessage("b", id="2")], Overwrite([HumanMessage("c", id="3")]), [AIMessage("d", id="4")]],
    ):
        channel = DeltaChannel(messages_delta_reducer()).from_checkpoint(list(base))
        channel.update(list(writes))
        assert _apply(list(base), [((), [("messages", w) for w in writes])]) == channel.get()
        channel = DeltaChannel(messages_delta_reducer()).from_checkpoint(list(base))
        channel.replay_writes([("t", "messages", w) for w in writes])
        assert _reduce(list(base), list(writes)) == channel.get()



def test_the_export_read_oldest_first_is_the_export_of_the_states_built_whole(
    database: tuple[Path, list[str]], saver: SqliteSaver, tmp_path: Path
) -> None:
    """The JSON Lines export (api/chat/branches.py ``lines``), read down the path from the writes
    stored on each parent (shared/storage/threads/history.py ``path``), is line for line the one
    made of every state built whole (``lines_by_states``): on every thread of every shape here
    (a fork, a state updated by hand, a cut run, approvals, a full copy of the messages), as one
    branch and as the branch the thread's newest checkpoint ends; and on the threads of the
    version before the DeltaChannel (tests/fixtures/pre-delta.db)."""
    import msgspec

    from api.chat import branches
    from shared.storage.threads import history

    pre_delta = tmp_path / "pre-delta.db"
    shutil.copyfile(Path(__file__).resolve().parents[1] / "fixtures" / "pre-delta.db", pre_delta)
    conn = sqlite3.connect(pre_delta, check_same_thread=False)
    with contextlib.closing(conn):
        old_saver = SqliteSaver(conn, serde=DecodedOnce())
        old_names = [row[0] for row in conn.execute("SELECT DISTINCT thread_id FROM checkpoints")]
        light = whole = 0
        for reading, names in ((saver, database[1]), (old_saver, old_names)):
            graph = ThreadStates(reading)
            for name in names:
                for forked in (False, True):
                    config = thread_at(name)
                    got = branches.lines(forked, graph, config)
                    expected = branches.lines_by_states(forked, graph, config)
                    assert msgspec.json.encode(got) == msgspec.json.encode(expected), (name, forked)
                for read in history.path(graph, thread_at(name)):
                    light, whole = light + read.light, whole + (not read.light)
    # Most checkpoints were read from their parent's; some not (each thread's first, copies, the fork).
    assert light > 3 * whole > 0, (light, whole)
