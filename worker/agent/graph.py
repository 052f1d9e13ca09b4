"""The agent graph: START → agent ⇄ tools → END, with an approval step before tools when needed.

Approvals (langgraph 1.2 interrupts): a turn whose tool calls include one that
needs approval goes from ``agent`` to ``approval`` instead of ``tools``. That node
raises one interrupt listing every such call of the turn (the prebuilt ToolNode
runs calls with ``asyncio.gather``, so interrupts raised inside tools would
surface one at a time, langgraph#6624), and nothing of the turn runs before the
decision. The interrupt is a pending write on the checkpoint: it survives any
crash. On resume the node runs again from its start, so nothing before
``interrupt()`` has a side effect; after it, the decisions become state:

* edited calls are rewritten in the assistant message (same message id, so the
  reducer replaces it); the proposed arguments are kept in its
  ``response_metadata["approvals"]`` with each decision, so the transcript says
  what was proposed and what was decided;
* each rejected call gets its ToolMessage at once ("the user rejected ..."),
  and only the calls still without a result go to the tools node. A rejected
  call is never executed.

One task per call: each call of a turn goes to ``tools`` as a ``Send`` of its own
(``{"tool_call", "message_id"}``, as LangGraph's prebuilt agent v2 does), from the
agent's routing and from the approval node alike, so a crash or a cut re-runs only
the calls without a result, never their finished siblings (LangGraph skips a task
whose writes were saved; the ledger answers one whose writes were lost,
worker/tools/ledger/). A ``tools`` task started with the whole state instead (a thread
checkpointed before one task per call) runs every call still without a result.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, SystemMessage, ToolMessage
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode
from langgraph.store.base import BaseStore
from langgraph.types import Command, Send, interrupt

from shared import tracing
from shared.contracts.assistants import AgentConfig, agent_in
from shared.contracts.codec import decode
from shared.contracts.jobs import Decision, DecisionAction
from shared.contracts.runs import AGENT, APPROVAL, APPROVALS_MARK, TOOLS
from shared.redis.metrics import MODEL_CALL
from shared.storage.threads.state import SNAPSHOT_FREQUENCY, AgentState, messages_channel
from worker.agent.model_calls import ModelCalls
from worker.metrics import timed
from worker.tools.ledger.calls import Ledger
from worker.tools.ledger.records import CallRef
from worker.tools.ledger.uncertain import APPROVAL_KIND
from worker.tools.policy import safe_to_repeat
from worker.tools.tasks import task_asker

__all__ = ["AGENT", "APPROVAL", "TOOLS", "build_graph", "read_system_prompt", "rejection_text"]

#: metadata key on an assistant message: its calls' decisions and proposed arguments


def rejection_text(decision: Decision) -> str:
    """What the model is told of a call the user rejected."""
    text = "The user rejected this tool call; it was not executed."
    return f"{text} Their message: {decision.message}" if decision.message else text


def _last_ai(messages: list[AnyMessage]) -> AIMessage | None:
    last = messages[-1] if messages else None
    return last if isinstance(last, AIMessage) else None


def _unanswered(messages: list[AnyMessage]) -> list[dict[str, Any]]:
    """The tool calls of the last assistant message that have no result yet."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, AIMessage):
            answered = {m.tool_call_id for m in messages[index + 1:] if isinstance(m, ToolMessage)}
            return [dict(c) for c in message.tool_calls if c["id"] not in answered]
    return []


def _sends(message: AIMessage, calls: Sequence[dict[str, Any]]) -> list[Send]:
    """One ``tools`` task per call of ``message`` (plain data: it is stored in the checkpoint)."""
    return [Send(TOOLS, {"tool_call": dict(call), "message_id": message.id or ""}) for call in calls]


def build_graph(
    *,
    model: BaseChatModel,
    tools: Sequence[BaseTool] | Callable[[], Sequence[BaseTool]],
    system_prompt: Callable[[], str],
    checkpointer: BaseCheckpointSaver[Any],
    needs_approval: Callable[[str], bool] = lambda tool: False,
    ledger: Ledger | None = None,
    model_calls: ModelCalls | None = None,
    models: Callable[[str], BaseChatModel] | None = None,
    store: BaseStore | None = None,
    snapshot_frequency: int = SNAPSHOT_FREQUENCY,
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """Compile the agent graph.

    ``tools`` is a list, or a function giving the tools now (``McpToolbox.current``):
    it is read before every model call and every tools step, so a tool server that
    comes back after start-up is offered again. The model is bound, and the tools
    node built, again only when that function returns another object.

    ``needs_approval(tool_name)`` tells the tools whose calls wait for a decision.

    ``ledger`` records each call's intent and outcome and answers a call already done
    (worker/tools/ledger/); without one (tests of the graph alone) calls are simply made.

    ``model_calls`` counts the model calls a resume makes again (worker/agent/model_calls.py).

    ``store``: the Store's items (shared/storage/memory.py), the graph's ``BaseStore``.

    ``snapshot_frequency``: a full copy of the messages every this many updates
    (``MESSAGES_SNAPSHOT_EVERY``, shared/storage/threads/state.py).

    ``system_prompt`` is called on every model call (edits to ``system.md``
    apply to the next call) and its text is prepended to the messages sent to
    the model, never written to the thread.

    A run of an assistant (shared/contracts/assistants.py: its ``AgentConfig`` in the run's
    ``configurable``) has its own system prompt, its model (made by ``models(name)``), only the
    tools it may use, and approvals for the tools it names besides ``needs_approval``'s.
    """
    bound = _Bound(model, tools, models)
    # Messages stored once per thread (DeltaChannel): see shared/storage/threads/state.py.
    graph = StateGraph(AgentState)
    # Each node's execution is a step's span when tracing is on (shared/tracing.py).
    graph.add_node(AGENT, tracing.step(AGENT, _agent_node(bound, system_prompt, model_calls)))
    graph.add_node(
        APPROVAL, tracing.step(APPROVAL, _approval_node(needs_approval)), destinations=(TOOLS, AGENT),
    )
    # Its input is a Send's payload, or the state: no one type the stubs accept.
    graph.add_node(TOOLS, tracing.step(TOOLS, _tools_node(bound, ledger)))
    graph.add_edge(START, AGENT)
    graph.add_conditional_edges(AGENT, _router(needs_approval), {TOOLS: TOOLS, APPROVAL: APPROVAL, END: END})
    graph.add_edge(TOOLS, AGENT)
    if snapshot_frequency != SNAPSHOT_FREQUENCY:
        # The same channel but for how often it copies the messages in full: set after the nodes,
        # whose hints name AgentState and would find its own channel a different one.
        graph.channels["messages"] = messages_channel(snapshot_frequency)
    return graph.compile(checkpointer=checkpointer, store=store)


#: the most (model, tools) pairs kept bound at once: assistants beyond them are bound again
_BOUND_KEPT = 64


class _Bound:
    """The model bound to the tools now, and the tools node for them, per (model, tools) an
    assistant chooses: made again only when the tools function returns another object."""

    def __init__(
        self, model: BaseChatModel, tools: Sequence[BaseTool] | Callable[[], Sequence[BaseTool]],
        models: Callable[[str], BaseChatModel] | None = None,
    ) -> None:
        self.model = model
        self.models = models
        self.tools_now: Callable[[], Sequence[BaseTool]] = tools if callable(tools) else (lambda: tools)
        self.model_name = getattr(model, "model", None) or type(model).__name__
        # per (model, tools): (the tools they were made for, the bound model, the tools node)
        self._made: dict[tuple[Any, ...], tuple[Sequence[BaseTool], Runnable[Any, Any], ToolNode]] = {}
        self._chat_models: dict[str, BaseChatModel] = {}

    def name(self, agent: AgentConfig | None) -> str:
        return agent.model if agent is not None and agent.model and self.models else self.model_name

    def _model(self, agent: AgentConfig | None) -> BaseChatModel:
        if agent is None or not agent.model or self.models is None:
            return self.model
        if agent.model not in self._chat_models:
            if len(self._chat_models) >= _BOUND_KEPT:
                self._chat_models.clear()
            self._chat_models[agent.model] = self.models(agent.model)
        return self._chat_models[agent.model]

    def now(self, agent: AgentConfig | None = None) -> tuple[Runnable[Any, Any], ToolNode]:
        current = self.tools_now()
        key = (None, None) if agent is None else (agent.model, agent.tools)
        made = self._made.get(key)
        if made is None or made[0] is not current:
            allowed = [t for t in current if agent is None or agent.allows(t.name)]
            model = self._model(agent)
            bound = model.bind_tools(allowed) if allowed else model
            if len(self._made) >= _BOUND_KEPT:
                self._made.clear()
            # Errors of a tool go back to the model as a ToolMessage with status "error"; a call
            # of a tool the assistant may not use is one ("not a valid tool").
            made = self._made[key] = (current, bound, ToolNode(allowed, handle_tool_errors=True))
        return made[1], made[2]


def _approval_needed(needs_approval: Callable[[str], bool], config: RunnableConfig) -> Callable[[str], bool]:
    """mcp.json's approvals, and the run's assistant's."""
    agent = agent_in(config)
    if agent is None or not agent.require_approval:
        return needs_approval
    return lambda tool: needs_approval(tool) or agent.requires(tool)


def _agent_node(
    bound: _Bound, system_prompt: Callable[[], str], model_calls: ModelCalls | None,
) -> Callable[[AgentState, RunnableConfig], Awaitable[dict[str, Any]]]:
    """The model's turn: the system prompt and the thread's messages in, one answer out."""

    async def agent(state: AgentState, config: RunnableConfig) -> dict[str, Any]:
        chosen = agent_in(config)
        prompt = chosen.system_prompt if chosen is not None and chosen.system_prompt is not None else (
            system_prompt()
        )
        messages = [SystemMessage(prompt), *state["messages"]] if prompt else list(state["messages"])
        model, _ = bound.now(chosen)
        if model_calls is not None:
            await model_calls.starting(config)
        with timed(MODEL_CALL), tracing.model_call(bound.name(chosen)) as call:
            try:
                response = await model.ainvoke(messages, call.config(config))
            except Exception:
                if model_calls is not None:
                    await model_calls.failed(config)
                raise
            call.answered(response)
        return {"messages": [response]}

    return agent


def _router(
    needs_approval: Callable[[str], bool],
) -> Callable[[AgentState, RunnableConfig], Awaitable[str | list[Send]]]:
    """After the model: the end, the approval, or one ``tools`` task per call."""

    # async: LangGraph runs a sync branch function of an async run in the default thread pool,
    # a thread hop per model turn for a few list lookups (17 % of the worker's samples were
    # spent handing it over: bench figure 16's profile).
    async def route(state: AgentState, config: RunnableConfig) -> str | list[Send]:
        message = _last_ai(state["messages"])
        if message is None or not message.tool_calls:
            return END
        needed = _approval_needed(needs_approval, config)
        if any(needed(c["name"]) for c in message.tool_calls):
            return APPROVAL
        return _sends(message, [dict(c) for c in message.tool_calls])

    return route


def _approval_node(
    needs_approval: Callable[[str], bool],
) -> Callable[[AgentState, RunnableConfig], Command[Any]]:
    """The interrupt listing the turn's calls that need a decision, then the decisions as state."""

    def approval(state: AgentState, config: RunnableConfig) -> Command[Any]:
        needed = _approval_needed(needs_approval, config)
        # Runs again from here on resume: nothing before interrupt() may act on the world.
        message = _last_ai(state["messages"])
        if message is None:  # routed here only after an answer with tool calls
            raise RuntimeError("approval step without a tool-calling answer")
        requests = [
            {"id": c["id"], "name": c["name"], "arguments": c["args"], "kind": APPROVAL_KIND}
            for c in message.tool_calls if needed(c["name"])
        ]
        answer = interrupt({"requests": requests})
        decisions = (decode(Decision, raw) for raw in answer)
        decided, rejections, to_run = _decide(message, {d.id: d for d in decisions})
        # Nothing left to run: the model hears the rejections at once.
        goto: str | list[Send] = _sends(decided, to_run) if to_run else AGENT
        return Command(update={"messages": [decided, *rejections]}, goto=goto)

    return approval


def _decide(
    message: AIMessage, decisions: dict[str, Decision],
) -> tuple[AIMessage, list[AnyMessage], list[dict[str, Any]]]:
    """The answer as decided (edited calls rewritten, the decisions and proposed arguments in its
    metadata), a result for each rejected call, and the calls left to run."""
    calls: list[Any] = []
    record: dict[str, Any] = {}
    rejections: list[AnyMessage] = []
    to_run: list[dict[str, Any]] = []
    for call in message.tool_calls:
        decision = decisions.get(str(call["id"]))
        if decision is None:  # needs no approval: runs with the others
            calls.append(call)
            to_run.append(dict(call))
            continue
        record[str(call["id"])] = {"action": decision.action.value, "proposed": call["args"],
                                   **({"message": decision.message} if decision.message else {}),
                                   **({"by": decision.by} if decision.by else {})}
        if decision.action is DecisionAction.REJECT:
            calls.append(call)
            rejections.append(ToolMessage(
                rejection_text(decision), name=call["name"], tool_call_id=call["id"], status="error",
            ))
        elif decision.action is DecisionAction.EDIT:
            calls.append({**call, "args": decision.arguments or {}})
            to_run.append(calls[-1])
        else:
            calls.append(call)
            to_run.append(dict(call))
    decided = message.model_copy(update={
        "tool_calls": calls,
        "response_metadata": {**message.response_metadata, APPROVALS_MARK: record},
    })
    return decided, rejections, to_run


def _tools_node(
    bound: _Bound, ledger: Ledger | None,
) -> Callable[[Any, RunnableConfig], Awaitable[dict[str, Any]]]:
    """One call (a ``Send``), or every call of the last answer still without a result."""

    async def run_tools(task: Any, config: RunnableConfig) -> dict[str, Any]:
        if isinstance(task, dict) and "tool_call" in task:  # a Send: one call
            result = await _run_call(bound, ledger, task["tool_call"], task["message_id"], config)
            return {"messages": [_with_id(result)]}
        # Started with the whole state (a thread checkpointed before one task per call):
        # every call of the last answer still without a result, one after another.
        messages = task["messages"]
        message = next((m for m in reversed(messages) if isinstance(m, AIMessage)), None)
        message_id = (message.id if message is not None else None) or ""
        results = [await _run_call(bound, ledger, c, message_id, config) for c in _unanswered(messages)]
        return {"messages": [_with_id(r) for r in results]}

    return run_tools


def _with_id(result: ToolMessage) -> ToolMessage:
    """The result with the id it is stored under, set here rather than by the state's reducer, so
    the run's ``result`` event can name it (worker/run/publish/stream.py): one per call, the same on every
    attempt of it."""
    if not result.id:
        result.id = f"tool-{result.tool_call_id}"
    return result


async def _run_call(
    bound: _Bound, ledger: Ledger | None, call: dict[str, Any], message_id: str, config: RunnableConfig,
) -> ToolMessage:
    """One call's result, through the ledger when there is one: where a tool call is recorded."""
    _, tool_node = bound.now(agent_in(config))

    async def send(arguments: dict[str, Any]) -> ToolMessage:
        # The prebuilt ToolNode for one call: its argument checks, and its errors as
        # a ToolMessage with status "error" for the model.
        output = await tool_node.ainvoke([{**call, "args": arguments, "type": "tool_call"}], config)
        result = output["messages"][0] if isinstance(output, dict) else output[0]
        if not isinstance(result, ToolMessage):
            raise TypeError(f"tool {call['name']} answered {type(result).__name__}, not a message")
        return result

    if ledger is None:
        return await send(call.get("args") or {})
    conversation = str(config.get("configurable", {}).get("thread_id", ""))
    run_id = str(config.get("metadata", {}).get("run_id", ""))
    tool = tool_node.tools_by_name.get(call["name"])
    return await ledger.run(
        CallRef(conversation, message_id, str(call["id"])), run_id, call, send,
        safe_to_repeat=tool is not None and safe_to_repeat(tool), ask=task_asker(tool, call),
    )


def read_system_prompt(path: Any) -> Callable[[], str]:
    """The prompt file's text, read again only when its size or mtime changed.

    Called on every model call, so an edit applies to the next one; a ``stat`` is
    cheaper than opening and reading the file each time.
    """
    seen: tuple[int, int] | None = None
    text = ""

    def read() -> str:
        nonlocal seen, text
        try:
            st = path.stat()
            if (st.st_mtime_ns, st.st_size) != seen:
                text = str(path.read_text()).strip()
                seen = (st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            seen, text = None, ""
        return text

    return read
