"""Branches of a conversation's thread, as the API reads them (DESIGN.md "Branches").

A thread is a tree of checkpoints. An edit or a regenerate of a user message forks it at the
checkpoint that received that message (its input checkpoint, whose ``__start__`` task carries
the message): the worker runs the new message from there (``checkpoint_id`` in the run's
config), so the new branch's checkpoints are children of it beside the old branch's. The branch
the conversation follows is the path from its head (``conversations.branch_head``, or the
thread's latest checkpoint) up to the root; a *fork point* on it is a checkpoint with more than
one child, and each child starts an *alternative*, named by its first message.

The functions taking a graph run in a reader process (:meth:`api.store.Store.read_thread`):
module-level, their results picklable. What the ledger says of the calls is added by the caller.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from api.chat.schemas import ActingCall, Alternative, Branch
from api.conversations.ledger_view import LedgerRow
from api.conversations.schemas import CheckpointLine, Message
from api.conversations.transcript import lines_along, lines_of, shown, thread_messages, to_message
from shared.contracts.events import text_of
from shared.storage.threads import branch

# LangGraph and langchain are imported by the functions that run in a reader process: the
# API's main process, which only names them, never loads either (api/store.py).
if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage
    from langchain_core.runnables import RunnableConfig

    from shared.storage.threads.snapshot import ThreadStates

    Graph = ThreadStates


@dataclass(frozen=True, slots=True)
class Call:
    """A tool call of an assistant message on a branch."""

    message_id: str
    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Found:
    """One alternative at a fork point: its first message, its latest checkpoint, its calls."""

    message: Message
    head: str
    calls: list[Call]


@dataclass(frozen=True, slots=True)
class Fork:
    checkpoint: str
    #: which alternative the conversation follows (from 0)
    index: int
    alternatives: list[Found]

    @property
    def message_id(self) -> str:
        """The message on the current branch where the fork shows: its alternative's first."""
        return self.alternatives[self.index].message.id


@dataclass(frozen=True, slots=True)
class Plan:
    """Where an edit or a regenerate forks the thread, and what the branch it leaves holds."""

    checkpoint: str
    #: the text the new branch starts with (a regenerate's: the user message's own)
    content: str
    abandoned: list[Call]


@dataclass(slots=True)
class _Tree:
    parent: dict[str, str | None]
    #: each checkpoint's ``source`` (``input``: it received a message)
    source: dict[str, str] = field(default_factory=dict)
    children: dict[str, list[str]] = field(default_factory=dict)
    head: str = ""
    #: root first, head last
    path: list[str] = field(default_factory=list)

    def latest_under(self, checkpoint: str) -> str:
        """The newest checkpoint of the subtree from ``checkpoint`` (ids sort by time)."""
        newest, todo = checkpoint, [checkpoint]
        while todo:
            node = todo.pop()
            newest = max(newest, node)
            todo += self.children.get(node, [])
        return newest


def thread_at(config: RunnableConfig, checkpoint_id: str | None = None) -> RunnableConfig:
    """The whole thread (a read's config may name the branch head), or one of its checkpoints."""
    return branch.thread_at(str(config["configurable"]["thread_id"]), checkpoint_id)


def _tree(graph: Graph, config: RunnableConfig) -> _Tree | None:
    """The thread's checkpoints as a tree (ids and parents only: no state is rebuilt)."""
    from langgraph.checkpoint.base import BaseCheckpointSaver

    saver = graph.checkpointer
    if not isinstance(saver, BaseCheckpointSaver):
        raise TypeError("the reader's graph has no checkpointer")
    parents: dict[str, str | None] = {}
    sources: dict[str, str] = {}
    for item in saver.list(thread_at(config)):
        parent = item.parent_config["configurable"].get("checkpoint_id") if item.parent_config else None
        checkpoint_id = str(item.config["configurable"]["checkpoint_id"])
        parents[checkpoint_id] = str(parent) if parent else None
        sources[checkpoint_id] = str((item.metadata or {}).get("source") or "")
    if not parents:
        return None
    tree = _Tree(parents, sources)
    for child, parent in parents.items():
        if parent is not None:
            tree.children.setdefault(parent, []).append(child)
    for children in tree.children.values():
        children.sort()
    named = config["configurable"].get("checkpoint_id")
    tree.head = str(named) if named in parents else max(parents)
    node: str | None = tree.head
    while node is not None:
        tree.path.append(node)
        node = parents.get(node)
    tree.path.reverse()
    return tree


def _messages(graph: Graph, config: RunnableConfig, checkpoint_id: str) -> list[BaseMessage]:
    return thread_messages(graph.get_state(thread_at(config, checkpoint_id)))


def _applied(graph: Graph, config: RunnableConfig, checkpoint_id: str) -> list[BaseMessage]:
    """The messages in the checkpoint's values (not its pending input)."""
    from langchain_core.messages import BaseMessage

    values = graph.get_state(thread_at(config, checkpoint_id)).values
    return [m for m in (values.get("messages") or []) if isinstance(m, BaseMessage)]


def _calls(messages: Iterable[BaseMessage]) -> list[Call]:
    from langchain_core.messages import AIMessage

    return [
        Call(m.id or "", call.get("id") or "", call["name"], dict(call.get("args") or {}))
        for m in messages if isinstance(m, AIMessage)
        for call in m.tool_calls
    ]


def _forks(graph: Graph, config: RunnableConfig, tree: _Tree) -> list[Fork]:
    forks = []
    current = _messages(graph, config, tree.head)
    for point, next_on_path in zip(tree.path, tree.path[1:], strict=False):
        children = tree.children.get(point, [])
        if len(children) < 2:
            continue
        base = len(_applied(graph, config, point))
        found = []
        for child in children:
            head = tree.head if child == next_on_path else tree.latest_under(child)
            messages = current if child == next_on_path else _messages(graph, config, head)
            after = messages[base:]
            first = to_message(after[0], f"{child}:0") if after else None
            if first is None:  # a branch whose first message was never recorded (a crash)
                continue
            found.append(Found(first, head, _calls(after)))
        index = next((i for i, f in enumerate(found) if f.head == tree.head), None)
        if index is not None and len(found) > 1:
            forks.append(Fork(point, index, found))
    return forks


def current(forked: bool, graph: Graph, config: RunnableConfig) -> tuple[list[Message], list[Fork]]:
    """The current branch's messages, and its fork points. ``forked``: the thread may have
    branches (``conversations.forked``); if not, its tree is not walked (every checkpoint read)."""
    messages = shown(thread_messages(graph.get_state(config)))
    tree = _tree(graph, config) if forked else None
    return messages, (_forks(graph, config, tree) if tree is not None else [])


def lines(forked: bool, graph: Graph, config: RunnableConfig) -> tuple[list[CheckpointLine], list[Fork]]:
    """The JSON Lines export of the current branch (oldest first), and its fork points.

    Read oldest first, each checkpoint's messages moved on from its parent's by the writes that
    made it (:func:`shared.storage.threads.history.path`): linear in the thread's length, but for
    the saver's decoding of the full copies of the messages it stored (bench figure 24). A graph
    other than the reader's (:class:`ThreadStates`) is read as :func:`lines_by_states` reads it.
    """
    # It imports LangGraph: here.
    from shared.storage.threads import history
    from shared.storage.threads.snapshot import ThreadStates

    if not isinstance(graph, ThreadStates):
        return lines_by_states(forked, graph, config)
    if not forked:  # one branch: the whole history
        return lines_along(history.path(graph, thread_at(config))), []
    tree = _tree(graph, config)
    if tree is None:
        return [], []
    return lines_along(history.path(graph, thread_at(config), set(tree.path))), _forks(graph, config, tree)


def lines_by_states(
    forked: bool, graph: Graph, config: RunnableConfig
) -> tuple[list[CheckpointLine], list[Fork]]:
    """:func:`lines` as each state of the history built whole gives it (its time quadratic in the
    thread's length: bench figure 24): what tests/test_export_lines.py holds :func:`lines` to."""
    # Newest first, a page at a time, each state rebuilt from its child's (it imports LangGraph: here).
    from shared.storage.threads import history

    if not forked:  # one branch: the whole history
        return lines_of(history.states(graph, thread_at(config))), []
    tree = _tree(graph, config)
    if tree is None:
        return [], []
    on_path = set(tree.path)
    on_branch = (
        state for state in history.states(graph, thread_at(config))
        if state.config["configurable"]["checkpoint_id"] in on_path
    )
    return lines_of(on_branch), _forks(graph, config, tree)


def switch_target(message_id: str, graph: Graph, config: RunnableConfig) -> str | None:
    """The head of the branch that starts with ``message_id`` at a fork point of the current branch."""
    tree = _tree(graph, config)
    for fork in _forks(graph, config, tree) if tree is not None else []:
        for found in fork.alternatives:
            if found.message.id == message_id:
                return found.head
    return None


#: why a fork cannot be planned: the message is not on the current branch, is not a user's
#: message (an edit), no user message comes before it (a regenerate), or the checkpoints before
#: it were pruned (shared/storage/threads/pruning.py: it is older than what its branch keeps)
MISSING, NOT_USER, NO_QUESTION, PRUNED = "missing", "not-user", "no-question", "pruned"


def plan(message_id: str, edit: bool, graph: Graph, config: RunnableConfig) -> Plan | str:
    """Where to fork the current branch to replace (``edit``) or answer again the user message
    ``message_id`` names (a regenerate may name the answer: its user message is the one before)."""
    from langchain_core.messages import HumanMessage

    tree = _tree(graph, config)
    if tree is None:
        return MISSING
    messages = _messages(graph, config, tree.head)
    index = next((i for i, m in enumerate(messages) if m.id == message_id), None)
    if index is None:
        return MISSING
    if not isinstance(messages[index], HumanMessage):
        if edit:
            return NOT_USER
        index = next((i for i in range(index, -1, -1) if isinstance(messages[i], HumanMessage)), None)
        if index is None:
            return NO_QUESTION
    asked = messages[index]
    # The first checkpoint of the path that holds the message (pending or applied): messages
    # only accumulate along a path, so a binary search finds it in a few state reads.
    low, high = 0, len(tree.path) - 1
    while low < high:
        middle = (low + high) // 2
        if any(m.id == asked.id for m in _messages(graph, config, tree.path[middle])):
            high = middle
        else:
            low = middle + 1
    first = tree.path[low]
    fork: str | None = first
    if any(m.id == asked.id for m in _applied(graph, config, first)):
        fork = tree.parent.get(first)  # applied by the checkpoint's own write: fork before it
    if fork is None:
        # Only a pruned thread's first checkpoint holds a message applied: an unpruned thread
        # begins with the input checkpoint that received its first message.
        return PRUNED
    base = len(_applied(graph, config, fork))
    # A message that began a branch was received by an input checkpoint forked from another
    # that received the message it replaced: its alternatives fork there, beside it.
    while (
        (parent := tree.parent.get(fork)) is not None and tree.source.get(parent) == "input"
        and len(_applied(graph, config, parent)) == base
    ):
        fork = parent
    return Plan(fork, text_of(asked.content), _calls(messages[base:]))


# --- what the ledger says --------------------------------------------------------------


def acting(calls: Sequence[Call], ledger: Sequence[LedgerRow]) -> list[ActingCall]:
    """The calls that were sent and may have acted: their tool is not known to be safe to repeat
    (the ledger's ``safe_to_repeat``: read-only or idempotent). Their effects stay in the world."""
    rows = {(r.message_id, r.tool_call_id): r for r in ledger}
    return [
        ActingCall(id=c.id, name=c.name, arguments=c.arguments)
        for c in calls
        if (row := rows.get((c.message_id, c.id))) is not None and not row.safe_to_repeat
    ]


def branch_of(fork: Fork, ledger: Sequence[LedgerRow]) -> Branch:
    return Branch(
        index=fork.index + 1,
        count=len(fork.alternatives),
        alternatives=[
            Alternative(message=f.message.id, content=f.message.content, acting_calls=acting(f.calls, ledger))
            for f in fork.alternatives
        ],
    )


def annotate(messages: Sequence[Message], forks: Sequence[Fork], ledger: Sequence[LedgerRow]) -> None:
    """Give the first message of each fork's current alternative its ``branch``."""
    at = {fork.message_id: fork for fork in forks}
    for message in messages:
        if (fork := at.get(message.id)) is not None:
            message.branch = branch_of(fork, ledger)
