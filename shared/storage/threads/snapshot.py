"""A thread's state, rebuilt from its checkpoints without LangGraph's graph runtime.

The API reads threads through the checkpointer (DESIGN.md, "Layout"): the saver's ``get_tuple``,
``list`` and ``get_delta_channel_history``, decoded by its serializer. What it then asks of the
thread, ``get_state`` / ``get_state_history`` (values, the tasks due, their interrupts, errors
and results), LangGraph answers on a compiled graph (``Pregel._prepare_state_snapshot``), whose
import costs a reader process ~30 MB and a third of a second (``langgraph.graph`` and
``langgraph.pregel``, with langgraph_sdk and httpx: bench figure 16). :class:`ThreadStates`
answers the same for the one graph shape Sophos runs (shared/storage/threads/state.py: START → agent
⇄ [approval →] tools → END, the tools as Sends), step for step as LangGraph 1.2.24 does:

- the messages: the checkpoint's snapshot of the DeltaChannel, or the snapshot before it and
  the writes since, through the batch reducer (:func:`shared.compat.messages_delta_reduce`);
  then the writes of no task (``NULL_TASK_ID``) and, for the head of a thread (``live``), those
  of the tasks of the step that already finished, in their tasks' order;
- the tasks due: each pending Send (``__pregel_tasks``), then each node whose trigger channel
  has a version its node has not seen, with LangGraph's task ids (the same hash of the same
  parts); their errors, interrupts (the head shows those still waiting) and results from the
  step's writes.

What it does not know it does not guess: a checkpoint of an older format, of a subgraph, or with
a channel or a Send the graph does not have is read by LangGraph's own graph
(:func:`shared.storage.threads.state.reader_graph`), imported then. tests/fast/test_snapshot.py reads
every checkpoint of real threads (tool calls, approvals, rejections, errors, forks, updates) both
ways and finds the same snapshots; it fails when the graph's shape changes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple, PendingWrite

from shared import compat
from shared.compat import (
    graph_snapshot,
    messages_delta_reduce,
    overwrite_of,
    pregel_constants,
    task_id,
    task_path_str,
)
from shared.contracts.runs import AGENT, APPROVAL, TOOLS
from shared.storage.threads.stand_ins import Interrupt, PregelTask, Send, Snapshot, StateSnapshot

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

K = pregel_constants()
DeltaSnapshot = compat.DeltaSnapshot
MESSAGES = "messages"
START = "__start__"
#: the graph's nodes, in the order LangGraph keeps them, and the channel that triggers each
NODES: dict[str, str] = {
    START: START, AGENT: f"branch:to:{AGENT}", APPROVAL: f"branch:to:{APPROVAL}", TOOLS: f"branch:to:{TOOLS}",
}
#: every channel of the graph; a checkpoint naming another is not this graph's
CHANNELS = frozenset({MESSAGES, K.TASKS, *NODES.values()})
#: the checkpoint format this module reads (``Checkpoint["v"]``)
CHECKPOINT_FORMAT = 4
_CONTROL = frozenset({K.ERROR, K.ERROR_SOURCE_NODE, K.INTERRUPT, K.RESUME})


class _Unknown(Exception):
    """A checkpoint this module does not read: LangGraph's graph reads it."""


class ThreadStates:
    """``get_state`` and ``get_state_history`` of the agent's threads, on ``checkpointer``."""

    def __init__(self, checkpointer: BaseCheckpointSaver[Any]) -> None:
        self.checkpointer = checkpointer

    def get_state(self, config: RunnableConfig) -> Snapshot:
        """As ``CompiledStateGraph.get_state(config)``: the head of the thread, or the checkpoint
        ``config`` names (then a record of its step, not its current status)."""
        configurable = dict(config.get("configurable") or {})
        configurable["thread_id"] = str(configurable["thread_id"])
        config = {**config, "configurable": configurable}
        saved = self.checkpointer.get_tuple(config)
        live = "checkpoint_id" not in configurable
        try:
            return self._snapshot(config, saved, live=live)
        except _Unknown:
            return self._graph().get_state(config)

    def get_state_history(
        self,
        config: RunnableConfig,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[Snapshot]:
        """As ``CompiledStateGraph.get_state_history``: the thread's checkpoints, newest first."""
        configurable = dict(config.get("configurable") or {})
        configurable["checkpoint_ns"] = configurable.get("checkpoint_ns", "")
        configurable["thread_id"] = str(configurable["thread_id"])
        config = {**config, "configurable": configurable}
        # Read whole before the first is rebuilt, as LangGraph does: no cursor held meanwhile.
        for saved in list(self.checkpointer.list(config, before=before, limit=limit, filter=filter)):
            yield self.history_state(saved)

    def history_state(self, saved: CheckpointTuple) -> StateSnapshot:
        """The state at ``saved``, a checkpoint the saver listed, as ``get_state_history`` gives it."""
        try:
            return self._snapshot(saved.config, saved, live=False)
        except _Unknown:
            from shared.storage.threads.state import langgraph_tuple

            graph = self._graph()
            return graph_snapshot(graph, langgraph_tuple(saved), graph.checkpointer)

    # --- a history read oldest first (shared/storage/threads/history.py: :func:`path`) -------

    def knows(self, saved: CheckpointTuple) -> bool:
        """Whether this module reads ``saved`` (its format, namespace and channels), so far as
        that shows before its tasks are prepared."""
        try:
            _check(saved)
        except _Unknown:
            return False
        return True

    def channel_value(self, saved: CheckpointTuple) -> list[Any] | None:
        """The messages channel's value at ``saved`` (a checkpoint :meth:`knows`): its stored
        copy, or the nearest copy before it and the writes since, as its state is rebuilt."""
        return self._messages(saved)

    def state_on(self, saved: CheckpointTuple, messages: list[Any]) -> StateSnapshot | None:
        """The state at ``saved`` as :meth:`history_state` gives it, ``messages`` taken for its
        messages channel's value (the caller's; an empty list for a state whose values are not
        read); None where :meth:`history_state` would ask LangGraph's graph."""
        try:
            return self._snapshot(saved.config, saved, live=False, messages=messages)
        except _Unknown:
            return None

    def copy(self, update: dict[str, Any] | None = None) -> ThreadStates:
        """As ``Pregel.copy(update={"checkpointer": saver})``: the same reads on another saver
        (shared/storage/threads/history.py reads a history through a view of the saver)."""
        return type(self)((update or {}).get("checkpointer", self.checkpointer))

    def _graph(self) -> Any:
        """LangGraph's own graph on the same checkpoints, with LangGraph's own types in them (the
        reader's serializer decodes Sends and Interrupts as stand-ins: stand_ins.py)."""
        from shared.storage.threads.state import reader_graph, with_langgraph_types

        return reader_graph(with_langgraph_types(self.checkpointer))

    # --- one snapshot ---------------------------------------------------------------------

    def _snapshot(
        self, config: RunnableConfig, saved: CheckpointTuple | None, *, live: bool,
        messages: list[Any] | None = None,
    ) -> StateSnapshot:
        if saved is None:
            return StateSnapshot({}, (), config, None, None, None, (), ())
        _check(saved)
        checkpoint = saved.checkpoint
        writes: list[PendingWrite] = list(saved.pending_writes or [])
        step = saved.metadata.get("step", -1) + 1
        tasks = _tasks_due(checkpoint, step)
        if messages is None:
            messages = self._messages(saved)
        if nulls := [w[1:] for w in writes if w[0] == K.NULL_TASK_ID]:
            messages = _apply(messages, [((), nulls)])
        statuses = _statuses(writes)
        done: set[str] = set()
        if live and writes:
            finished = [
                (path, list(statuses[tid].output)) for tid, (_, path) in tasks.items()
                if tid in statuses and statuses[tid].output
            ]
            done = {tid for tid in tasks if tid in statuses and statuses[tid].output}
            if finished:
                messages = _apply(messages, finished)
        with_writes = tuple(
            _task(tid, name, path, statuses.get(tid, _NOT_STARTED), live=live)
            for tid, (name, path) in tasks.items()
        )
        shown = {} if messages is None else {MESSAGES: messages}
        return StateSnapshot(
            shown,
            tuple(name for tid, (name, _) in tasks.items() if tid not in done),
            _with_checkpoint_map(saved.config, saved.metadata),
            saved.metadata,
            checkpoint["ts"],
            _with_checkpoint_map(saved.parent_config, saved.metadata),
            with_writes,
            tuple(i for task in with_writes for i in task.interrupts),
        )

    def _messages(self, saved: CheckpointTuple) -> list[Any] | None:
        """The messages at the checkpoint (empty when the channel was never written)."""
        stored = saved.checkpoint["channel_values"].get(MESSAGES, _MISSING)
        if stored is not _MISSING:
            return list(stored.value) if isinstance(stored, DeltaSnapshot) else (stored or [])
        if MESSAGES not in saved.checkpoint["channel_versions"]:
            return []
        history = self.checkpointer.get_delta_channel_history(config=saved.config, channels=[MESSAGES])
        found = history.get(MESSAGES)
        if found is None:
            return []
        seed = found.get("seed", _MISSING)
        base = [] if seed is _MISSING or seed is None else (
            list(seed.value) if isinstance(seed, DeltaSnapshot) else seed
        )
        return _reduce(base, [value for _, _, value in found["writes"]])


_MISSING: Any = object()


def _check(saved: CheckpointTuple) -> None:
    """Raise :class:`_Unknown` for a checkpoint of another format, a subgraph's, or with a
    channel the graph does not have."""
    checkpoint = saved.checkpoint
    if checkpoint.get("v") != CHECKPOINT_FORMAT or saved.config["configurable"].get("checkpoint_ns"):
        raise _Unknown
    values, versions = checkpoint["channel_values"], checkpoint["channel_versions"]
    if not set(values) <= CHANNELS or not set(versions) <= CHANNELS:
        raise _Unknown


class _Status:
    """A task's writes in its step (LangGraph's ``TaskStatus``)."""

    __slots__ = ("error", "interrupts", "output")

    def __init__(self) -> None:
        self.output: list[tuple[str, Any]] = []
        self.interrupts: list[Interrupt] = []
        self.error: Exception | None = None


_NOT_STARTED = _Status()


def _statuses(writes: Sequence[PendingWrite]) -> dict[str, _Status]:
    found: dict[str, _Status] = {}
    for tid, channel, value in writes:
        if tid == K.NULL_TASK_ID:
            continue
        status = found.setdefault(tid, _Status())
        if channel == K.INTERRUPT:
            status.interrupts.extend(value if isinstance(value, Sequence) else [value])
        elif channel == K.ERROR:
            if status.error is None:
                status.error = value
        elif channel not in _CONTROL:
            status.output.append((channel, value))
    return found


def _task(tid: str, name: str, path: tuple[Any, ...], status: _Status, *, live: bool) -> PregelTask:
    finished = bool(status.output)
    result: Any = None
    if finished:
        if any(channel == K.RETURN for channel, _ in status.output):
            result = next(value for channel, value in status.output if channel == K.RETURN)
        else:
            result = _result([(c, v) for c, v in status.output if c == MESSAGES])
    interrupts = () if live and finished else tuple(status.interrupts)
    return PregelTask(tid, name, path, status.error, interrupts, None, result)


def _result(writes: list[tuple[str, Any]]) -> dict[str, Any]:
    """A finished task's writes to the state (LangGraph's ``map_task_result_writes``)."""
    result: dict[str, Any] = {}
    for channel, value in writes:
        existing = result.get(channel)
        if existing is not None:
            several = isinstance(existing, dict) and "$writes" in existing
            earlier = existing["$writes"] if several else [existing]
            earlier.append(value)
            result[channel] = {"$writes": earlier}
        else:
            result[channel] = value
    return result


def _tasks_due(checkpoint: Mapping[str, Any], step: int) -> dict[str, tuple[str, tuple[Any, ...]]]:
    """The step's tasks, id → (node, path), in LangGraph's order: the Sends, then the nodes."""
    values, versions = checkpoint["channel_values"], checkpoint["channel_versions"]
    ident = bytes.fromhex(checkpoint["id"].replace("-", ""))
    tasks: dict[str, tuple[str, tuple[Any, ...]]] = {}
    for idx, packet in enumerate(values.get(K.TASKS) or []):
        if not isinstance(packet, Send) or packet.node not in NODES or packet.node == START:
            raise _Unknown
        # A Send's path has a third part, False (``prepare_push_task_send``).
        path = (K.PUSH, idx, False)
        tasks[task_id(ident, packet.node, str(step), packet.node, K.PUSH, str(idx))] = (packet.node, path)
    if not versions:
        return tasks
    null = type(next(iter(versions.values())))()
    for name, trigger in NODES.items():
        if trigger not in values:  # the channel holds no value: not available
            continue
        seen = checkpoint["versions_seen"].get(name)
        if seen is not None and not versions.get(trigger, null) > seen.get(trigger, null):
            continue
        tasks[task_id(ident, name, str(step), name, K.PULL, trigger)] = (name, (K.PULL, name))
    return tasks


def _apply(
    messages: list[Any] | None, tasks: list[tuple[tuple[Any, ...], list[tuple[str, Any]]]]
) -> list[Any] | None:
    """The messages after ``tasks``' writes, in LangGraph's order of tasks (``apply_writes``)."""
    written = [
        value
        for _, writes in sorted(tasks, key=lambda task: task_path_str(task[0]))
        for channel, value in writes
        if channel == MESSAGES
    ]
    if not written:
        return messages
    # One step's writes, as ``DeltaChannel.update`` takes them: an Overwrite among them is the value.
    for value in written:
        overwritten, replacement = overwrite_of(value)
        if overwritten:
            return list(replacement) if replacement is not None else []
    return messages_delta_reduce(messages or [], written)


def _reduce(base: list[Any], writes: list[Any]) -> list[Any]:
    """``base`` after the writes since it, as ``DeltaChannel.replay_writes`` applies them (the last
    Overwrite resets it, the writes after it are applied to that)."""
    start = 0
    for i, value in enumerate(writes):
        overwritten, replacement = overwrite_of(value)
        if overwritten:
            base = list(replacement) if replacement is not None else []
            start = i + 1
    rest = writes[start:]
    return messages_delta_reduce(base, rest) if rest else base


def _with_checkpoint_map(config: RunnableConfig | None, metadata: Mapping[str, Any] | None) -> Any:
    """LangGraph's ``patch_checkpoint_map``: a config with its parents' checkpoints, if any."""
    if config is None:
        return None
    parents = metadata.get("parents") if metadata else None
    if not parents:
        return config
    conf = config["configurable"]
    return {
        **config,
        "configurable": {
            **conf, "checkpoint_map": {**parents, conf["checkpoint_ns"]: conf["checkpoint_id"]},
        },
    }
