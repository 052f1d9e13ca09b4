"""A cancel cuts a run where it stands; what the cut leaves in the thread.

The run service runs a run's ``astream`` in a task of its own (:attr:`LiveRun.task`)
and cancels that task the moment a cancel is heard (worker/run/publish/progress.py,
:class:`~worker.run.publish.progress.CancelSignals`): in the middle of the model's answer, of
a tool call, or between two steps. LangGraph's own step bookkeeping unwinds with
the cancellation (the node's HTTP request or MCP call is abandoned, background
checkpoint writes already started are awaited), so the thread's last checkpoint
is a step boundary, perhaps with the results of a task that finished before the
cut.

The user pressed stop: the conversation must take their next message, the model
must be callable on the thread, and nothing must run again behind their back. So
:func:`close_thread` closes the cut through LangGraph (``aupdate_state``, a
checkpoint like any step's), one step at a time, until nothing is left to run:

* the run's message never reached a checkpoint (cut before the first one): it is
  recorded, as the graph's input would have been;
* a task that finished before the cut but whose step was not checkpointed: its
  result is applied as it came (it happened);
* a tools step, running or about to run (one task per call, worker/agent/graph.py):
  the calls that finished keep their results (as their tasks returned them, or as the
  ledger recorded them when the cut fell between the outcome's commit and the task's
  return: ``from_ledger``), and every other tool call of the
  last answer gets one saying the user stopped it (``status="error"``, marked
  stopped), since a model may be called only with every tool call answered;
* the model's answer in flight, or about to start: what was streamed of it
  becomes the assistant's message (empty if nothing was), marked stopped, with
  no tool calls, so the graph goes to END.

Stopped messages carry ``response_metadata={"stopped": True}``; the API shows
them with ``status: "stopped"``. Afterwards the thread has no task left: the
conversation is not resumable into the step that was cut. Anything else found
(an interrupt, several tasks not all of ``tools``, a node this module does not know) is left as it
is, as a crash would leave it: the conversation is then resumable.

The runs in progress are listed in :class:`LiveRuns` for as long as their graph streams
(worker/run/service.py): the cancel subscription, the leases (worker/run/lifetime/leases.py), the
sweep and a shutdown (worker/__main__.py) reach them there alone.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import structlog
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import RunControl
from redis.asyncio import Redis

from shared.contracts.runs import STOPPED_MARK
from worker.agent.graph import AGENT, TOOLS
from worker.run.publish.progress import CancelSignals

log = structlog.get_logger(__name__)

START = "__start__"
#: what a tool call cut short answers the model
STOPPED_TOOL_RESULT = "The user stopped this tool call before it returned; its outcome is unknown."
#: the marker on messages written by a cut
STOPPED = {STOPPED_MARK: True}
#: a cut takes at most input + finished task + tools + answer: more means something unknown
_MAX_CLOSING_STEPS = 5


@dataclass(slots=True, eq=False)
class LiveRun:
    """A run in progress, as the cancel signal and a shutdown see it."""

    control: RunControl
    #: the run's message, for a run cut before its input checkpoint (None for a resume)
    input: HumanMessage | None = None
    #: the task streaming the graph (None until it starts)
    task: asyncio.Task[Any] | None = None
    #: a cancel was heard: the run is being cut
    stopping: bool = False
    #: another worker took the run over (PostgreSQL, worker/run/lifetime/leases.py): cut, nothing recorded
    lease_lost: bool = False
    #: the tasks the stream has seen start and not finish (task id → node); a tools step
    #: has one per tool call (worker/agent/graph.py)
    running: dict[str, str] = field(default_factory=dict)
    #: the run has ended (worker/run/outcome/ending.py): whatever happens to its task now records nothing
    ended: bool = False
    #: ends the run ``interrupted`` now, whatever its step does (SIGTERM past SHUTDOWN_TIMEOUT)
    abandon: Callable[[], Awaitable[None]] | None = None
    #: the text the model has streamed in the agent step in flight
    partial: list[str] = field(default_factory=list)
    #: results of the tasks of the step in flight that finished, by task id: a cut
    #: while their writes wait for the database must not lose what they did
    results: dict[str, dict[str, Any]] = field(default_factory=dict)

    def stop(self) -> bool:
        """Cut the run now. False if it was already being cut."""
        if self.stopping:
            return False
        self.stopping = True
        if self.task is not None:
            self.task.cancel()
        return True

    @property
    def node(self) -> str | None:
        """The node of a task in progress (the step's node), None between steps."""
        return next(iter(self.running.values()), None)

    def started(self, node: str, task_id: str = "") -> bool:
        """A task started; True when it is the first of a new step.

        A step's tasks all start before any of them finishes, and all finish before
        the next step starts: no task in progress means a new step.
        """
        new_step = not self.running
        if new_step:  # the last step's results are its checkpoint's now
            self.results = {}
        self.running[task_id] = node
        if node == AGENT:
            self.partial = []
        return new_step

    def finished(self, node: str, task_id: str = "", result: Any = None) -> None:
        if self.running.pop(task_id, None) is None:  # started without its id: one of its node
            self.running.pop(next((t for t, n in self.running.items() if n == node), ""), None)
        if task_id and isinstance(result, dict):
            self.results[task_id] = result
        if node == AGENT:
            self.partial = []  # it is the task's result now, not a partial answer

    def streamed(self, text: str) -> None:
        self.partial.append(text)


class LiveRuns:
    """Run id → :class:`LiveRun`, for the runs streaming now."""

    def __init__(self) -> None:
        self._runs: dict[str, LiveRun] = {}

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._runs

    def __iter__(self) -> Iterator[str]:
        return iter(self._runs)

    def __len__(self) -> int:
        return len(self._runs)

    def add(self, run_id: str, live: LiveRun) -> None:
        self._runs[run_id] = live

    def remove(self, run_id: str) -> None:
        self._runs.pop(run_id, None)

    def drain(self, reason: str = "shutdown") -> int:
        """Ask every run to stop at its next step boundary; how many there are."""
        for live in self._runs.values():
            if not live.stopping:  # a run being cut for a cancel stays cancelled
                live.control.request_drain(reason)
        return len(self._runs)

    def stop(self, run_id: str) -> None:
        """Cut ``run_id`` now if it is in progress here (a cancel was asked)."""
        live = self._runs.get(run_id)
        if live is not None and live.stop():
            log.info("run.cancel_requested", run_id=run_id, node=live.node)

    async def abandon(self) -> int:
        """End every run still in progress ``interrupted`` now: SIGTERM past ``SHUTDOWN_TIMEOUT``.

        Its step did not reach a boundary in time (a call that does not yield to
        cancellation, a tool that ignores it): the run is recorded and its stream ended
        before the worker closes its stores, whatever the step goes on doing.
        """
        late = [live for live in self._runs.values() if live.abandon is not None and not live.ended]
        for live in late:
            try:
                await live.abandon()  # type: ignore[misc]
            except Exception:
                log.exception("run.abandon_failed")
        return len(late)

    def lose(self, run_id: str) -> None:
        """Drop ``run_id``: its lease is another worker's now (worker/run/lifetime/leases.py); nothing more is
        written."""
        live = self._runs.get(run_id)
        if live is not None:
            live.lease_lost = True
            live.stop()

    def cancel_signals(self, redis: Redis) -> CancelSignals:
        """The worker's one subscription to cancels (an async context manager, for its life)."""
        return CancelSignals(redis, self.stop, lambda: list(self._runs))


@dataclass(slots=True)
class Closed:
    """What :func:`close_thread` did."""

    #: nothing is left to run in the thread
    finished: bool = False
    #: a stopped message was written (False: the run had in fact finished)
    stopped: bool = False
    message_count: int = 0
    #: the tool results it wrote, for the run's trace events
    tool_results: list[ToolMessage] = field(default_factory=list)
    #: the answer it wrote, if any
    answer: AIMessage | None = None


#: a tool call's result as the ledger recorded it (worker/tools/ledger/), by the id of the assistant
#: message that made it, the call's id and its tool; None when it has no outcome
Recorded = Callable[[str, str, str], Awaitable[ToolMessage | None]]


async def _none(message_id: str, tool_call_id: str, tool: str) -> ToolMessage | None:
    return None


async def close_thread(
    graph: CompiledStateGraph[Any, Any, Any, Any], config: RunnableConfig, live: LiveRun,
    from_ledger: Recorded = _none,
) -> Closed:
    """Close a cut run's thread (see the module docstring). Raises what the database raises."""
    closed = Closed()
    partial = "".join(live.partial)
    for _ in range(_MAX_CLOSING_STEPS):
        state = await graph.aget_state(config)
        messages: list[BaseMessage] = list((state.values or {}).get("messages", []))
        closed.message_count = len(messages)
        tasks = list(state.tasks)
        recorded = live.input is None or any(m.id == live.input.id for m in messages)
        if not recorded and not any(t.name == START for t in tasks):
            # Cut before the input checkpoint: the message is the thread's all the same.
            await graph.aupdate_state(config, {"messages": [live.input]}, as_node=START)
            continue
        if not tasks:
            closed.finished = True
            return closed
        if any(t.interrupts for t in tasks):
            break
        if all(t.name == TOOLS for t in tasks):
            closed.tool_results += await _close_tools_step(graph, config, live, messages, tasks, from_ledger)
            closed.stopped = closed.stopped or bool(closed.tool_results)
            continue
        if len(tasks) > 1:
            break
        task = tasks[0]
        # Finished before the cut, its writes saved, or seen in the stream while they
        # waited for the database when the cut came: it happened, keep it.
        result = task.result if task.result is not None else live.results.pop(task.id, None)
        if result is not None:
            await graph.aupdate_state(config, result, as_node=task.name)
        elif task.name == START and live.input is not None:
            await graph.aupdate_state(config, {"messages": [live.input]}, as_node=START)
        elif task.name == AGENT:
            answer = AIMessage(partial, id=str(uuid.uuid4()), response_metadata=dict(STOPPED))
            await graph.aupdate_state(config, {"messages": [answer]}, as_node=AGENT)
            partial = ""
            closed.answer = answer
            closed.stopped = True
        else:
            break
    log.warning("run.cut_left_open", tasks=[t.name for t in state.tasks])
    closed.stopped = True
    return closed


async def _close_tools_step(
    graph: CompiledStateGraph[Any, Any, Any, Any], config: RunnableConfig, live: LiveRun,
    messages: list[BaseMessage], tasks: list[Any], from_ledger: Recorded,
) -> list[ToolMessage]:
    """Close a tools step (one task per call): keep what finished, answer the rest "stopped".

    A finished call's result is kept whether its writes were saved or were only seen in the
    stream (``live.results``): it happened. One update for the whole step, as the step's
    tasks together would have written; the stopped results it wrote are returned.
    """
    finished: list[BaseMessage] = []
    for task in tasks:
        result = task.result if task.result is not None else live.results.pop(task.id, None)
        if result is not None:
            finished += [m for m in result.get("messages", []) if isinstance(m, ToolMessage)]
    # A call whose outcome the ledger has, its task's result lost to the cut: it happened too.
    last = next((m for m in reversed(messages) if isinstance(m, AIMessage)), None)
    message_id = (last.id if last is not None else None) or ""
    for call in _stopped_results([*messages, *finished]) if message_id else []:
        kept = await from_ledger(message_id, call.tool_call_id, call.name or "")
        if kept is not None:
            finished.append(kept)
    stopped = _stopped_results([*messages, *finished])
    await graph.aupdate_state(config, {"messages": [*finished, *stopped]}, as_node=TOOLS)
    return stopped


def _stopped_results(messages: list[BaseMessage]) -> list[ToolMessage]:
    """A stopped result for each tool call of the last answer that has none."""
    answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
    last = next((m for m in reversed(messages) if isinstance(m, AIMessage)), None)
    calls = last.tool_calls if last is not None else []
    return [
        ToolMessage(
            STOPPED_TOOL_RESULT, tool_call_id=call["id"] or "", name=call["name"],
            status="error", id=str(uuid.uuid4()), response_metadata=dict(STOPPED),
        )
        for call in calls
        if call["id"] not in answered
    ]

