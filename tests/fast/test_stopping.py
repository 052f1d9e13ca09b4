"""What a cut leaves in the thread (worker/run/lifetime/stopping.py), on the real graph, an in-memory saver.

No model is called: the thread is brought to the state a cut finds with
``aupdate_state``, as the run would have left it, and :func:`close_thread` closes it.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import RunControl

from shared.contracts.runs import STOPPED_MARK
from worker.agent.graph import AGENT, TOOLS, _unanswered, build_graph
from worker.run.lifetime.stopping import STOPPED_TOOL_RESULT, LiveRun, _stopped_results, close_thread

START = "__start__"


def _graph() -> CompiledStateGraph[Any, Any, Any, Any]:
    never = GenericFakeChatModel(messages=iter(()))  # the cut never calls the model
    return build_graph(model=never, tools=[], system_prompt=lambda: "", checkpointer=InMemorySaver())


def _config() -> RunnableConfig:
    return {"configurable": {"thread_id": str(uuid.uuid4())}}


def _live(message: HumanMessage | None = None, partial: str = "") -> LiveRun:
    live = LiveRun(control=RunControl(), input=message)
    if partial:
        live.streamed(partial)
    return live


def _human(text: str = "hello") -> HumanMessage:
    return HumanMessage(text, id=str(uuid.uuid4()))


def _calling(*names: str) -> AIMessage:
    calls = [{"name": name, "args": {}, "id": f"call-{i}", "type": "tool_call"}
             for i, name in enumerate(names)]
    return AIMessage("", id=str(uuid.uuid4()), tool_calls=calls)


def _result(call_id: str, text: str = "done") -> ToolMessage:
    return ToolMessage(text, tool_call_id=call_id, name="t", id=str(uuid.uuid4()))


Graph = CompiledStateGraph[Any, Any, Any, Any]


async def _messages(graph: Graph, config: RunnableConfig) -> list[BaseMessage]:
    state = await graph.aget_state(config)
    assert not state.tasks, [t.name for t in state.tasks]  # closed: nothing left to run
    return list(state.values["messages"])


def _stopped(message: BaseMessage) -> bool:
    return bool(message.response_metadata.get(STOPPED_MARK))


async def test_a_cut_before_the_first_checkpoint_records_the_message_and_a_stopped_answer() -> None:
    graph, config, message = _graph(), _config(), _human()

    closed = await close_thread(graph, config, _live(message, partial="Hal"))

    assert closed.finished and closed.stopped
    human, answer = await _messages(graph, config)
    assert human.id == message.id
    assert isinstance(answer, AIMessage) and answer.content == "Hal" and not answer.tool_calls
    assert _stopped(answer) and closed.answer is not None and closed.answer.id == answer.id
    assert closed.message_count == 2  # the thread as it was left


async def test_a_cut_in_the_model_step_keeps_what_was_streamed() -> None:
    graph, config, message = _graph(), _config(), _human()
    await graph.aupdate_state(config, {"messages": [message]}, as_node=START)  # the input checkpoint

    closed = await close_thread(graph, config, _live(message, partial="Half an ans"))

    assert closed.finished and closed.stopped and not closed.tool_results
    messages = await _messages(graph, config)
    assert [m.type for m in messages] == ["human", "ai"]
    assert messages[-1].content == "Half an ans" and _stopped(messages[-1])


async def test_a_cut_in_the_tools_step_answers_every_open_call_then_stops_the_answer() -> None:
    graph, config = _graph(), _config()
    calling = _calling("fetch", "remember", "add")
    await graph.aupdate_state(config, {"messages": [_human(), calling]}, as_node=AGENT)
    # One task per call (worker/agent/graph.py).
    assert [t.name for t in (await graph.aget_state(config)).tasks] == [TOOLS] * 3

    closed = await close_thread(graph, config, _live())

    assert closed.finished and closed.stopped
    assert [m.tool_call_id for m in closed.tool_results] == ["call-0", "call-1", "call-2"]
    messages = await _messages(graph, config)
    results = [m for m in messages if isinstance(m, ToolMessage)]
    assert [r.content for r in results] == [STOPPED_TOOL_RESULT] * 3
    assert all(r.status == "error" and _stopped(r) for r in results)
    # The model may be called again on this thread: every call answered, the last answer ends it.
    assert _unanswered(messages) == []  # type: ignore[arg-type]
    assert isinstance(messages[-1], AIMessage) and messages[-1].content == "" and _stopped(messages[-1])


async def test_a_cut_in_the_tools_step_keeps_the_calls_that_finished() -> None:
    graph, config = _graph(), _config()
    calling = _calling("fetch", "remember", "add")
    await graph.aupdate_state(config, {"messages": [_human(), calling]}, as_node=AGENT)
    tasks = (await graph.aget_state(config)).tasks
    live = _live()
    for task in tasks:
        live.started(TOOLS, task.id)
    # The second call finished (seen in the stream, its writes not saved yet): it happened.
    finished = _result("call-1", "remembered")
    live.finished(TOOLS, tasks[1].id, {"messages": [finished]})

    closed = await close_thread(graph, config, live)

    assert closed.finished and closed.stopped
    assert [m.tool_call_id for m in closed.tool_results] == ["call-0", "call-2"]
    results = {m.tool_call_id: m for m in await _messages(graph, config) if isinstance(m, ToolMessage)}
    assert results["call-1"].content == "remembered" and not _stopped(results["call-1"])
    assert [results[c].content for c in ("call-0", "call-2")] == [STOPPED_TOOL_RESULT] * 2


async def test_a_task_that_finished_before_the_cut_is_kept_as_it_came() -> None:
    graph, config, message = _graph(), _config(), _human()
    await graph.aupdate_state(config, {"messages": [message]}, as_node=START)
    [task] = (await graph.aget_state(config)).tasks
    live = _live(message, partial="ignored once the answer is in")
    live.started(AGENT)
    answer = AIMessage("The whole answer", id=str(uuid.uuid4()))
    live.finished(AGENT, task.id, {"messages": [answer]})  # seen in the stream, not yet checkpointed

    closed = await close_thread(graph, config, live)

    assert closed.finished and not closed.stopped and closed.answer is None
    messages = await _messages(graph, config)
    assert messages[-1].id == answer.id and not _stopped(messages[-1])


async def test_a_finished_thread_is_left_as_it_is() -> None:
    graph, config, message = _graph(), _config(), _human()
    done = AIMessage("ok", id=str(uuid.uuid4()))
    await graph.aupdate_state(config, {"messages": [message, done]}, as_node=AGENT)

    closed = await close_thread(graph, config, _live(message))

    assert closed.finished and not closed.stopped and closed.message_count == 2
    assert [m.id for m in await _messages(graph, config)] == [message.id, done.id]


@pytest.mark.parametrize(
    ("messages", "open_calls"),
    [
        ([], []),
        ([_human()], []),
        ([_human(), _calling("a", "b")], ["call-0", "call-1"]),
        ([_human(), _calling("a", "b"), _result("call-1")], ["call-0"]),
        ([_human(), _calling("a"), _result("call-0")], []),
        # only the last answer counts: an older one's open call is not asked again
        ([_calling("old"), _human(), AIMessage("plain", id="x")], []),
    ],
)
def test_the_open_calls_are_those_of_the_last_answer_without_a_result(
    messages: list[BaseMessage], open_calls: list[str]
) -> None:
    assert [c["id"] for c in _unanswered(messages)] == open_calls  # type: ignore[arg-type]
    assert [r.tool_call_id for r in _stopped_results(messages)] == open_calls


def test_a_second_stop_is_refused_and_the_stream_state_follows_the_steps() -> None:
    live = _live()
    assert live.stop() and live.stopping
    assert not live.stop()

    live.started(AGENT)
    live.streamed("a")
    live.streamed("b")
    assert live.node == AGENT and live.partial == ["a", "b"]
    live.finished(AGENT, "task-1", {"messages": []})
    assert live.node is None and live.partial == [] and "task-1" in live.results
    live.started(TOOLS)  # a new step: the last one's results belong to its checkpoint now
    assert live.results == {}


async def test_a_cut_keeps_a_result_the_ledger_recorded_when_its_task_result_was_lost() -> None:
    """Cut between the outcome's commit (worker/tools/ledger/records.py) and the task's return: the call ran,
    and its result is kept from the ledger, not answered "stopped"."""
    graph, config = _graph(), _config()
    calling = _calling("fetch", "remember")
    await graph.aupdate_state(config, {"messages": [_human(), calling]}, as_node=AGENT)
    live = _live()
    asked: list[tuple[str, str, str]] = []

    async def from_ledger(message_id: str, tool_call_id: str, tool: str) -> ToolMessage | None:
        asked.append((message_id, tool_call_id, tool))
        return _result("call-1", "remembered, says the ledger") if tool_call_id == "call-1" else None

    closed = await close_thread(graph, config, live, from_ledger)

    assert sorted(asked) == [(calling.id, "call-0", "fetch"), (calling.id, "call-1", "remember")]
    assert [m.tool_call_id for m in closed.tool_results] == ["call-0"]
    results = {m.tool_call_id: m for m in await _messages(graph, config) if isinstance(m, ToolMessage)}
    assert results["call-1"].content == "remembered, says the ledger" and not _stopped(results["call-1"])
    assert results["call-0"].content == STOPPED_TOOL_RESULT
