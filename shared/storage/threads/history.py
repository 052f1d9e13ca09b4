"""A thread's whole history read newest first in time linear in its length (issue 44).

LangGraph rebuilds each state of ``get_state_history`` on its own: the messages are a
``DeltaChannel``, so every checkpoint's list is its nearest snapshot (every
``SNAPSHOT_FREQUENCY`` updates) plus the writes of each ancestor since, and the saver's
``get_delta_channel_history`` walks those ancestors again for every checkpoint, deserializing
each one's blob on the way (measured: 44,696 ancestor rows for the 600 checkpoints of a
400-message thread, three quarters of an export's time). Read newest first, a checkpoint's
history is its child's less the writes stored on it (those made the child): :class:`HistoryWalk`
keeps the last history it gave and, when the next one asked for is that checkpoint's parent,
answers from it without a query. Anything else (another order, a checkpoint holding a snapshot,
other channels) is asked of the saver as before. Same result, the same objects: only the walk
is saved.

It also reads the history a page at a time (:func:`states`): the checkpoints LangGraph lists
are materialized whole before the first state is built, each with its pending writes.

That still builds every state whole, each of nearly the whole message list: quadratic in the
thread (bench figure 24). The JSON Lines export needs of each checkpoint only what it added, so
it reads a path oldest first instead (:func:`path`): each checkpoint's messages are its parent's
after the writes stored on the parent, and only the ids those writes set can differ; the states
where that may not hold are built whole as above. ``states`` stays for the comparison
(``api.chat.branches.lines_by_states``, tests/test_export_lines.py).
"""

from __future__ import annotations

from collections.abc import Container, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple

from shared.compat import overwrite_of, pregel_constants

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import DeltaChannelHistory
    from langgraph.pregel import Pregel

    from shared.storage.threads.snapshot import ThreadStates
    from shared.storage.threads.stand_ins import Snapshot as StateSnapshot

#: checkpoints listed at a time by :func:`states`
PAGE = 200
#: the channel of the messages (shared/storage/threads/state.py)
MESSAGES = "messages"
NULL_TASK_ID = pregel_constants().NULL_TASK_ID


@dataclass(frozen=True, slots=True)
class _Listed:
    """What the walk needs of a checkpoint it listed: its parent, the channels it holds whole,
    and how many writes it stores on each channel."""

    parent: str | None
    held: frozenset[str]
    writes: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class _Given:
    checkpoint: str
    channels: tuple[str, ...]
    histories: Mapping[str, DeltaChannelHistory]


class HistoryWalk(BaseCheckpointSaver[Any]):
    """A read-only view of ``saver`` whose delta histories, asked for newest first along a
    path, cost one query per snapshot interval instead of one walk per checkpoint."""

    def __init__(self, saver: BaseCheckpointSaver[Any]) -> None:
        super().__init__(serde=saver.serde)
        self.saver = saver
        self._listed: dict[str, _Listed] = {}
        self._given: _Given | None = None
        #: the histories asked of ``saver`` (the others were made from a child's)
        self.walks = 0

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self.saver.get_tuple(config)

    def get_next_version(self, current: Any, channel: None) -> Any:
        return self.saver.get_next_version(current, channel)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        # A new page: the walk goes on from the last checkpoint given, and what this page lists.
        kept = self._listed.get(self._given.checkpoint) if self._given else None
        self._listed = {self._given.checkpoint: kept} if self._given and kept else {}
        for found in self.saver.list(config, filter=filter, before=before, limit=limit):
            counts: dict[str, int] = {}
            for _, channel, _ in found.pending_writes or ():
                counts[channel] = counts.get(channel, 0) + 1
            parent = (found.parent_config or {}).get("configurable", {}).get("checkpoint_id")
            self._listed[str(found.config["configurable"]["checkpoint_id"])] = _Listed(
                parent=str(parent) if parent else None,
                held=frozenset(found.checkpoint.get("channel_values") or ()), writes=counts,
            )
            yield found

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        target = config["configurable"].get("checkpoint_id")
        found = self._from_child(str(target), tuple(channels)) if target else None
        if found is None:
            self.walks += 1
        histories = (
            found if found is not None
            else self.saver.get_delta_channel_history(config=config, channels=channels)
        )
        self._given = _Given(str(target), tuple(channels), histories) if target else None
        return histories

    def _from_child(self, target: str, channels: tuple[str, ...]) -> dict[str, DeltaChannelHistory] | None:
        """``target``'s histories from its child's, given last: the child's less the writes
        stored on ``target`` (the last of them, oldest first). None when that does not hold."""
        given, child = self._given, self._listed.get(self._given.checkpoint) if self._given else None
        listed = self._listed.get(target)
        if given is None or child is None or listed is None or child.parent != target:
            return None
        if given.channels != channels or listed.held.intersection(channels):
            return None
        out: dict[str, DeltaChannelHistory] = {}
        for channel in channels:
            before = given.histories[channel]
            writes = list(before["writes"])
            stored = listed.writes.get(channel, 0)
            if stored > len(writes):
                return None
            entry: DeltaChannelHistory = {"writes": writes[: len(writes) - stored]}
            if "seed" in before:
                entry["seed"] = before["seed"]
            out[channel] = entry
        return out


def states(
    graph: Pregel[Any, Any, Any, Any] | ThreadStates, config: RunnableConfig, page: int = PAGE
) -> Iterator[StateSnapshot]:
    """``graph.get_state_history(config)``, newest first, read ``page`` checkpoints at a time
    on a :class:`HistoryWalk` of the graph's saver (``graph`` must have one)."""
    saver = graph.checkpointer
    if not isinstance(saver, BaseCheckpointSaver):
        raise TypeError("the graph reads a thread without a saver")
    wrapped = saver if isinstance(saver, HistoryWalk) else HistoryWalk(saver)
    walk = graph.copy(update={"checkpointer": wrapped})
    before: RunnableConfig | None = None
    while True:
        count = 0
        for state in walk.get_state_history(config, before=before, limit=page):
            count += 1
            yield state
            before = state.config
        if count < page:
            return



# --- a path read oldest first, each state's messages moved on from its parent's ----------------


class _Missing:
    """What the channel held under an id its parent's writes added: nothing."""

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


@dataclass(slots=True)
class Read:
    """A checkpoint of a path, read after the one before it (:func:`path`).

    ``light``: its parent was read just before it, and its messages channel is its parent's after
    the writes stored on the parent (ids only set, none removed); then ``state`` was built on an
    empty channel (its tasks, next and metadata are its own; its values are not to be read),
    ``channel`` is the channel's value, by id in its order (the walk's own, moved on at the next
    read), ``position`` each id's place in it, and ``written`` what the channel held before under
    each id the writes set (:data:`MISSING`: nothing). Otherwise ``state`` is the state
    ``get_state_history`` gives, built whole.
    """

    saved: CheckpointTuple
    state: StateSnapshot
    #: its parent is the checkpoint read just before it
    adjacent: bool
    light: bool
    channel: Mapping[str, Any] | None
    position: Mapping[str, int]
    written: Mapping[str, Any]
    _graph: ThreadStates
    #: the channel's value at the checkpoint read before (a read that is not light), when known
    _before: Mapping[str, Any] | None

    def whole(self) -> StateSnapshot:
        """The state ``get_state_history`` gives, built on the channel (a light read's)."""
        if not self.light or self.channel is None:
            return self.state
        state = self._graph.state_on(self.saved, list(self.channel.values()))
        return state if state is not None else self._graph.history_state(self.saved)

    def previously(self, key: str) -> Any | None:
        """What the channel held under ``key`` at the checkpoint read before (a light read's)."""
        value = self.written[key] if key in self.written else (self.channel or {}).get(key)
        return None if value is MISSING else value

    def before(self) -> dict[str, Any] | None:
        """The messages channel's value at the checkpoint read before, by id (None: not known)."""
        if not self.light or self.channel is None:
            return dict(self._before) if self._before is not None else None
        return {
            key: old for key, now in self.channel.items()
            if (old := self.written.get(key, now)) is not MISSING
        }


def path(graph: ThreadStates, config: RunnableConfig, keep: Container[str] | None = None) -> Iterator[Read]:
    """The thread's checkpoints (those in ``keep``, if given), oldest first, each state built
    from its parent's messages and the writes stored on the parent, in time linear in the path
    (the saver's listing included when its serializer decodes a full copy of the messages only
    when read, as the reader's does: shared/storage/threads/decoding.py; bench figure 24).

    LangGraph stores a DeltaChannel's value only every ``SNAPSHOT_FREQUENCY`` updates; between
    two copies a checkpoint's value is the copy before it and the writes stored on each
    checkpoint since (``get_delta_channel_history``: the writes stored on a checkpoint are the
    step that made its child). So, read down a path, a checkpoint's messages are its parent's
    after the writes stored on the parent: ``add_messages`` sets each written message under its
    id (in place when the id is there, else at the end). That is what a light :class:`Read`
    does; a checkpoint where it may not hold is built whole, as ``get_state_history`` builds it
    (:meth:`ThreadStates.history_state`): the first one read, one whose parent was not read just
    before it (another branch, a pruned thread's first), one holding a copy of its messages (a
    snapshot) that may not be its parent's after those writes (:func:`_follows`: a fork's first
    checkpoint, LangGraph snapshots it; a copy decoded when the saver listed it), one written by
    ``update_state``, one with writes of no task on the messages, or whose parent's writes are
    anything but messages with ids (an ``Overwrite``, a ``RemoveMessage``).

    A :class:`Read` holds the walk's own channel: use it before asking for the next.
    """
    everything = list(graph.checkpointer.list(config))
    children: dict[str | None, int] = {}
    for saved in everything:
        children[_parent(saved)] = children.get(_parent(saved), 0) + 1
    listed = [saved for saved in everything if keep is None or _id(saved) in keep]
    listed.reverse()
    channel: dict[str, Any] | None = None
    position: dict[str, int] = {}
    previous: CheckpointTuple | None = None
    for saved in listed:
        adjacent = previous is not None and _parent(saved) == _id(previous)
        read: Read | None = None
        if adjacent and channel is not None and previous is not None and _may_be_light(saved):
            written = _written(previous)
            if written is not None and not _follows(saved, channel, written, children.get(_id(previous), 0)):
                written = None
            state = graph.state_on(saved, []) if written is not None else None
            if written is not None and state is not None:
                before: dict[str, Any] = {}
                for message in written:
                    key = message.id
                    if key not in before:
                        before[key] = channel.get(key, MISSING)
                    if key not in channel:
                        position[key] = len(position)
                    channel[key] = message
                read = Read(saved, state, True, True, channel, position, before, graph, None)
        if read is None:
            known = graph.knows(saved)
            value = graph.channel_value(saved) if known else None
            state = graph.state_on(saved, list(value)) if value is not None else None
            if state is None:
                value, state = None, graph.history_state(saved)
            read = Read(saved, state, adjacent, False, None, {}, {}, graph, channel if adjacent else None)
            yield read
            channel, position = _by_id(value)
        else:
            yield read
        previous = saved


def _id(saved: CheckpointTuple) -> str:
    return str(saved.config["configurable"]["checkpoint_id"])


def _parent(saved: CheckpointTuple) -> str | None:
    parent = (saved.parent_config or {}).get("configurable", {}).get("checkpoint_id")
    return str(parent) if parent else None


def _may_be_light(saved: CheckpointTuple) -> bool:
    """Whether ``saved`` may be read from its parent: no value of its messages but a copy
    decoded when read (:func:`_follows` says whether it is its parent's after the writes), not
    written by ``update_state``, no writes of no task on the messages (they change its own
    values)."""
    checkpoint = saved.checkpoint
    held = checkpoint["channel_values"].get(MESSAGES, MISSING)
    if held is not MISSING and getattr(held, "length", None) is None:
        return False
    if MESSAGES not in checkpoint["channel_versions"]:
        return False
    if (saved.metadata or {}).get("source") not in ("loop", "input"):
        return False
    writes = saved.pending_writes or ()
    return not any(tid == NULL_TASK_ID and channel == MESSAGES for tid, channel, _ in writes)


def _follows(saved: CheckpointTuple, channel: Mapping[str, Any], written: list[Any], children: int) -> bool:
    """Whether a checkpoint holding a copy of its messages (a snapshot) may be read from its
    parent's and the writes stored on the parent, as one that holds none is: LangGraph copies
    the list every ``SNAPSHOT_FREQUENCY`` updates as the run has it, its parent's after that
    step's writes, which it stores on the parent (tests/test_lazy_snapshots.py compares the
    two on real threads). It also copies it to start a branch from a checkpoint whose writes made
    another child (``delta_channels_with_pending_writes``): so only an only child is read so, and
    only when the copy, as long as its header says (not decoded), is as long as that reading
    (either check alone keeps tests/fast/test_snapshot.py's fork by a new input at an old
    checkpoint whole). A checkpoint holding no copy follows always (LangGraph reads it so)."""
    held = saved.checkpoint["channel_values"].get(MESSAGES, MISSING)
    if held is MISSING:
        return True
    if children != 1:  # the parent's
        return False
    added = {m.id for m in written if m.id not in channel}
    return bool(held.length == len(channel) + len(added))


def _written(parent: CheckpointTuple) -> list[Any] | None:
    """The messages the writes stored on ``parent`` set, in the order they are applied; None when
    they do more than set messages under their ids."""
    from langchain_core.messages import BaseMessage, RemoveMessage

    out: list[Any] = []
    for _, channel, value in parent.pending_writes or ():
        if channel != MESSAGES:
            continue
        if overwrite_of(value)[0]:
            return None
        for message in value if isinstance(value, list) else [value]:
            if not isinstance(message, BaseMessage) or isinstance(message, RemoveMessage) or not message.id:
                return None
            out.append(message)
    return out


def _by_id(messages: list[Any] | None) -> tuple[dict[str, Any] | None, dict[str, int]]:
    """The channel's value by id, and each id's place; None when not every message has an id of
    its own (then the next checkpoint is built whole too)."""
    from langchain_core.messages import BaseMessage

    if messages is None:
        return None, {}
    channel = {m.id: m for m in messages if isinstance(m, BaseMessage) and m.id}
    if len(channel) != len(messages):
        return None, {}
    return channel, {key: i for i, key in enumerate(channel)}
