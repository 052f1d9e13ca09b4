"""The ledger of tool effects (worker/tools/ledger/) on a real SQLite file, and the graph's one task
per call.

No process: the ledger runs on :class:`SqliteDatabase` in the test's directory, the graph on
an in-memory saver with a scripted model and a local tool that notes the ``_meta`` it would send.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import StructuredTool
from langgraph.checkpoint.memory import InMemorySaver
from msgspec import UNSET

from api.conversations.ledger_view import LedgerRow, annotate, resume_plan
from api.conversations.schemas import Message, ToolCall, ToolTask
from shared.contracts.ledger import DONE, INTENT
from shared.redis.metrics import TOOL_CALLS, TOOL_CALLS_FROM_TASK, MetricBatch, counter_field
from tests.support.fault_hooks import hold_call
from tests.support.ledger import ledger_on
from worker.agent.graph import TOOLS, build_graph
from worker.metrics import collecting
from worker.tools.ledger.attempt import IDEMPOTENCY_META_KEY, request_meta, task_state
from worker.tools.ledger.records import CallRef


async def test_an_intent_keeps_its_key_across_attempts_and_an_outcome_ends_them(tmp_path: Path) -> None:
    ledger, db, conversation = await ledger_on(tmp_path)
    try:
        ref, other = CallRef(conversation, "m1", "call-1"), CallRef(conversation, "m1", "call-2")
        first = await ledger.begin(ref, "run-1", "tools__echo", {"text": "a"})
        assert first is not None and (first.state, first.attempt) == (INTENT, 1)
        assert await ledger.begin(ref, "run-2", "tools__echo", {"text": "a"}) is None  # it has a row
        again = await ledger.again(ref, "run-2")
        assert again is not None and (again.state, again.attempt, again.key) == (INTENT, 2, first.key)
        started = await ledger.begin(other, "run-1", "tools__echo", {"text": "a"})
        assert started is not None and started.key != first.key
        edited = await ledger.again(other, "run-2", {"text": "b"})  # an edit: a new key
        assert edited is not None and edited.key not in (started.key, first.key) and edited.attempt == 2

        await ledger.record_outcome(ref, "success", "a")
        await ledger.record_outcome(ref, "error", "late")  # the first outcome stays
        assert await ledger.again(ref, "run-3") is None  # done: no more attempts
        done = await ledger.entry(ref)
        assert done is not None
        assert (done.state, done.attempt, done.status, done.content) == (DONE, 2, "success", "a")
    finally:
        await db.close()


async def test_a_call_with_an_outcome_is_answered_from_the_ledger_never_sent_again(tmp_path: Path) -> None:
    ledger, db, conversation = await ledger_on(tmp_path)
    sent: list[Any] = []

    async def send(arguments: dict[str, Any]) -> ToolMessage:
        sent.append(request_meta())
        return ToolMessage("boom", tool_call_id="call-1", name="tools__fail", status="error")

    try:
        ref = CallRef(conversation, "m1", "call-1")
        call = {"name": "tools__fail", "args": {}, "id": "call-1"}
        first = await ledger.run(ref, "run-1", call, send)
        second = await ledger.run(ref, "run-2", call, send)
        assert len(sent) == 1 and set(sent[0]) == {IDEMPOTENCY_META_KEY}
        assert (second.content, second.status, second.tool_call_id) == (first.content, "error", "call-1")
        assert request_meta() is None  # only around the request
    finally:
        await db.close()


async def test_a_result_kept_by_a_cut_is_not_counted_answered_from_the_ledger(tmp_path: Path) -> None:
    """``answered`` counts later attempts answered instead of sent; a cut keeping the outcome of
    the call's one attempt (worker/run/lifetime/stopping.py, through ``Ledger.recorded``) is not one."""
    ledger, db, conversation = await ledger_on(tmp_path)

    async def send(arguments: dict[str, Any]) -> ToolMessage:
        return ToolMessage("sent once", tool_call_id="call-1", name="tools__echo")

    def tool_calls(batch: MetricBatch) -> dict[str, int]:
        return {outcome: batch.counts[field] for outcome in ("success", "answered")
                if (field := counter_field(TOOL_CALLS, outcome=outcome)) in batch.counts}

    try:
        ref = CallRef(conversation, "m1", "call-1")
        call = {"name": "tools__echo", "args": {}, "id": "call-1"}
        with collecting(MetricBatch()) as run:
            await ledger.run(ref, "run-1", call, send)
        assert tool_calls(run) == {"success": 1}
        with collecting(MetricBatch()) as cut:
            kept = await ledger.recorded(ref, "tools__echo")
            unknown = await ledger.recorded(CallRef(conversation, "m1", "call-2"), "tools__echo")
        assert kept is not None and (kept.content, kept.tool_call_id) == ("sent once", "call-1")
        assert unknown is None and not cut
        with collecting(MetricBatch()) as resumed:  # a later attempt: that one is answered
            await ledger.run(ref, "run-2", call, send)
        assert tool_calls(resumed) == {"answered": 1}
    finally:
        await db.close()


async def test_the_fault_points_are_where_the_kill_matrix_holds_a_call(tmp_path: Path) -> None:
    """Before the intent, after it (before the request), before each commit of a task's state (the
    first: the server made the task), after the result (before the outcome); a call answered from
    the ledger passes only the first. ``hold_call`` stops only its tool there."""
    ledger, db, conversation = await ledger_on(tmp_path)
    reached: list[tuple[str, str]] = []
    sent: list[str] = []

    async def note(point: str, tool: str) -> None:
        reached.append((point, tool))

    async def send(arguments: dict[str, Any]) -> ToolMessage:
        sent.append(str(arguments))
        reached.append(("request", "tools__echo"))
        return ToolMessage("a", tool_call_id="call-1", name="tools__echo")

    try:
        ledger.hold = note
        ref, call = CallRef(conversation, "m1", "call-1"), {"name": "tools__echo", "args": {"text": "a"}}
        await ledger.run(ref, "run-1", call, send)
        assert [p for p, _ in reached] == ["before_intent", "after_intent", "request", "before_outcome"]
        reached.clear()
        await ledger.run(ref, "run-2", call, send)
        assert reached == [("before_intent", "tools__echo")]

        async def as_task(arguments: dict[str, Any]) -> ToolMessage:  # the transport reports its task
            reached.append(("request", "far__long"))
            await task_state("task-1", "working")
            await task_state("task-1", "completed")
            return ToolMessage("done", tool_call_id="call-4", name="far__long")

        reached.clear()
        task_call = {"name": "far__long", "args": {}}
        await ledger.run(CallRef(conversation, "m1", "call-4"), "run-1", task_call, as_task)
        assert [p for p, _ in reached] == ["before_intent", "after_intent", "request", "before_task_state",
                                          "before_task_state", "before_outcome"]

        ledger.hold = hold_call("after_intent:tools__echo")
        other = CallRef(conversation, "m1", "call-2")
        assert (await ledger.run(other, "run-3", {"name": "tools__add", "args": {}}, send)).content == "a"
        held = asyncio.create_task(ledger.run(CallRef(conversation, "m1", "call-3"), "run-3", call, send))
        deadline = asyncio.get_running_loop().time() + 10
        while (entry := await ledger.entry(CallRef(conversation, "m1", "call-3"))) is None:
            assert asyncio.get_running_loop().time() < deadline, "the intent was never committed"
            await asyncio.sleep(0.01)
        assert entry.state == INTENT and not held.done() and len(sent) == 2  # held before its request
        held.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await held

        # Held once the server made the task: the intent committed, the task's id not.
        stop = hold_call("before_task_state:far__long")
        assert stop is not None

        at_task = asyncio.Event()

        async def stopping(point: str, tool: str) -> None:
            if point == "before_task_state":
                at_task.set()
            await stop(point, tool)

        ledger.hold = stopping
        made = CallRef(conversation, "m1", "call-5")
        held = asyncio.create_task(ledger.run(made, "run-3", task_call, as_task))
        await asyncio.wait_for(at_task.wait(), 10)
        entry = await ledger.entry(made)
        assert entry is not None and (entry.state, entry.task_id) == (INTENT, None) and not held.done()
        held.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await held
    finally:
        await db.close()


class _Scripted(GenericFakeChatModel):
    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


async def test_each_call_of_a_turn_is_a_task_of_its_own_with_a_key_of_its_own(tmp_path: Path) -> None:
    ledger, db, conversation = await ledger_on(tmp_path)
    metas: list[dict[str, Any] | None] = []

    async def echo(text: str) -> str:
        metas.append(request_meta())
        return text

    tool = StructuredTool.from_function(coroutine=echo, name="echo", description="echo")
    calls = [{"name": "echo", "args": {"text": t}, "id": f"call-{t}", "type": "tool_call"} for t in "abc"]
    model = _Scripted(messages=iter([AIMessage("", tool_calls=calls), AIMessage("done")]))
    graph = build_graph(
        model=model, tools=lambda: [tool], system_prompt=lambda: "", checkpointer=InMemorySaver(),
        ledger=ledger,
    )
    config: Any = {"configurable": {"thread_id": conversation}, "metadata": {"run_id": "run-1"}}
    started: list[str] = []
    try:
        payload: Any
        async for payload in graph.astream(
            {"messages": [HumanMessage("hi", id="h")]}, config, stream_mode="tasks", durability="sync",
        ):
            if "input" in payload:
                started.append(payload["name"])
        assert started.count(TOOLS) == 3
        keys = [m[IDEMPOTENCY_META_KEY] for m in metas if m is not None]
        assert len(keys) == 3 and len(set(keys)) == 3
        rows = await db.fetchall(
            "SELECT tool_call_id, state, attempt, run_id FROM tool_calls WHERE conversation_id = ?"
            " ORDER BY tool_call_id", (conversation,),
        )
        assert rows == [(f"call-{t}", DONE, 1, "run-1") for t in "abc"]
        messages = (await graph.aget_state(config)).values["messages"]
        assert [m.content for m in messages if isinstance(m, ToolMessage)] == ["a", "b", "c"]
    finally:
        await db.close()


async def test_a_tools_step_checkpointed_before_one_task_per_call_still_runs_every_open_call() -> None:
    """A thread whose pending ``tools`` task takes the whole state (the graph before ``Send``)."""
    from langgraph.types import Command

    from worker.agent.graph import APPROVAL

    async def echo(text: str) -> str:
        return text

    tool = StructuredTool.from_function(coroutine=echo, name="echo", description="echo")
    calls = [{"name": "echo", "args": {"text": t}, "id": f"call-{t}", "type": "tool_call"} for t in "ab"]
    graph = build_graph(
        model=_Scripted(messages=iter([AIMessage("done")])), tools=[tool], system_prompt=lambda: "",
        checkpointer=InMemorySaver(),
    )
    config: Any = {"configurable": {"thread_id": "legacy"}}
    await graph.aupdate_state(config, {"messages": [HumanMessage("hi", id="h")]}, as_node="__start__")
    calling = AIMessage("", id="ai", tool_calls=calls)
    await graph.aupdate_state(config, Command(update={"messages": [calling]}, goto=TOOLS), as_node=APPROVAL)
    assert [t.name for t in (await graph.aget_state(config)).tasks] == [TOOLS]  # one task, the whole state

    async for _ in graph.astream(None, config):
        pass

    messages = (await graph.aget_state(config)).values["messages"]
    assert [m.content for m in messages if isinstance(m, ToolMessage)] == ["a", "b"]
    assert messages[-1].content == "done"


async def test_a_call_made_as_a_task_is_answered_from_its_task_and_a_forgotten_one_is_uncertain(
    tmp_path: Path,
) -> None:
    """The task id is committed beside the intent; the next attempt of a call cut with one asks the
    server (``ask``) first: its answer is the outcome, counted; a task the server forgot is recorded
    ``forgotten`` and the call goes the uncertain way (safe to repeat here: sent again, task id cleared)."""
    ledger, db, conversation = await ledger_on(tmp_path)
    sent: list[str] = []
    asked: list[str] = []

    async def cut(arguments: dict[str, Any]) -> ToolMessage:
        await task_state(f"task-{len(sent)}", "working")
        sent.append("cut")
        raise RuntimeError("the worker died")  # an intent and a task id, no outcome

    async def ask(task_id: str) -> ToolMessage | None:
        asked.append(task_id)
        await task_state(task_id, "completed")
        if task_id != "task-0":
            return None  # the server does not know it
        return ToolMessage("done: far", tool_call_id="call-1", name="far__long")

    async def send(arguments: dict[str, Any]) -> ToolMessage:
        sent.append("sent")
        return ToolMessage("sent again", tool_call_id="call-2", name="near__long")

    try:
        far, near = CallRef(conversation, "m1", "call-1"), CallRef(conversation, "m1", "call-2")
        for ref, name in ((far, "far__long"), (near, "near__long")):
            with contextlib.suppress(RuntimeError):
                await ledger.run(ref, "run-1", {"name": name, "args": {}, "id": ref.tool_call_id}, cut)
        cut_far = await ledger.entry(far)
        assert cut_far is not None and (cut_far.state, cut_far.task_id, cut_far.task_state) == (
            INTENT, "task-0", "working")
        with collecting(MetricBatch()) as resumed:
            answered = await ledger.run(far, "run-2", {"name": "far__long", "args": {}, "id": "call-1"}, send,
                                        ask=ask)
            again = await ledger.run(near, "run-2", {"name": "near__long", "args": {}, "id": "call-2"}, send,
                                     ask=ask, safe_to_repeat=True)
        assert (answered.content, again.content) == ("done: far", "sent again")
        assert (asked, sent) == (["task-0", "task-1"], ["cut", "cut", "sent"])
        assert resumed.counts[counter_field(TOOL_CALLS_FROM_TASK)] == 1
        done_far, done_near = await ledger.entry(far), await ledger.entry(near)
        assert done_far is not None and (done_far.state, done_far.attempt, done_far.task_state) == (
            DONE, 1, "completed")
        assert done_near is not None
        assert (done_near.state, done_near.attempt, done_near.task_id) == (DONE, 2, None)
    finally:
        await db.close()


def test_a_resume_plan_asks_the_server_of_a_known_task() -> None:
    """``resumePlan``: ``task`` for a cut call with a task its server may know, ``ask`` once forgotten."""
    message = Message(id="m1", role="assistant", content="", tool_calls=[
        ToolCall(id=f"c{i}", name="far__long", arguments={}) for i in range(3)])
    rows = [LedgerRow("m1", "c0", "far__long", "k0", 1, "intent", False, "t0", "working"),
            LedgerRow("m1", "c1", "far__long", "k1", 1, "intent", False, "t1", "forgotten"),
            LedgerRow("m1", "c2", "far__long", "k2", 1, "intent", False)]
    assert [p.action for p in resume_plan([message], rows)] == ["task", "ask", "ask"]
    annotate([message], rows)
    assert [c.ledger.task for c in message.tool_calls if c.ledger is not UNSET] == [  # type: ignore[union-attr]
        ToolTask(id="t0", state="working"), ToolTask(id="t1", state="forgotten"), UNSET]
