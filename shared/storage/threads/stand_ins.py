"""LangGraph's state types as a reader process reads them, without importing ``langgraph.types``.

``langgraph.types`` imports ``langchain_core.runnables`` (for ``Runnable``, which none of these
types needs) and with it langchain's tracers, langsmith's client, requests' kin and
OpenTelemetry's SDK: ~18 MB a reader process (bench figure 16), loaded as soon as a checkpoint
holding a tool call's ``Send`` or an ``Interrupt`` is decoded. A reader only reads these values,
so it decodes them as the plain classes below (shared/storage/threads/decoding.py) and builds
its snapshots with them (shared/storage/threads/snapshot.py): same fields, same equality, read by
attribute as LangGraph's are (``state.tasks[i].interrupts[j].value``). Only what hands them to
LangGraph's own graph (a checkpoint :class:`ThreadStates` does not read) turns them back into
LangGraph's types, with :func:`as_langgraph`.

Standard library only: a value of these types that crosses to the API's process is unpickled
there by reference, importing this module and nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, TypeAlias

if TYPE_CHECKING:
    import langgraph.types

#: LangGraph's ``Interrupt`` id when none was given (``langgraph.types._DEFAULT_INTERRUPT_ID``)
DEFAULT_INTERRUPT_ID = "placeholder-id"


class Send:
    """LangGraph's ``Send``: a packet for ``node`` (the agent's graph sends each tool call so)."""

    __slots__ = ("arg", "node", "timeout")

    def __init__(self, node: str, arg: Any, timeout: Any = None) -> None:
        self.node = node
        self.arg = arg
        self.timeout = timeout

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Send):
            return False
        return (self.node, self.arg, self.timeout) == (other.node, other.arg, other.timeout)

    def __hash__(self) -> int:
        return hash((self.node, self.arg, self.timeout))

    def __repr__(self) -> str:
        if self.timeout is None:
            return f"Send(node={self.node!r}, arg={self.arg!r})"
        return f"Send(node={self.node!r}, arg={self.arg!r}, timeout={self.timeout!r})"


class Interrupt:
    """LangGraph's ``Interrupt``: a value a task waits on (an approval's requests), and its id."""

    __slots__ = ("id", "response_schema", "value")

    def __init__(self, value: Any, id: str = DEFAULT_INTERRUPT_ID, response_schema: Any = None) -> None:
        self.value = value
        self.id = id
        self.response_schema = response_schema

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Interrupt) and (self.value, self.id, self.response_schema) == (
            other.value, other.id, other.response_schema,
        )

    __hash__ = None  # type: ignore[assignment]  # as LangGraph's (a dataclass with eq)

    def __repr__(self) -> str:
        return f"Interrupt(value={self.value!r}, id={self.id!r}, response_schema={self.response_schema!r})"


class PregelTask(NamedTuple):
    """LangGraph's ``PregelTask``: a task of a snapshot's step."""

    id: str
    name: str
    path: tuple[Any, ...]
    error: Exception | None = None
    interrupts: tuple[Any, ...] = ()
    state: Any = None
    result: Any | None = None


class StateSnapshot(NamedTuple):
    """LangGraph's ``StateSnapshot``: a thread's state at the start of a step."""

    values: Any
    next: tuple[str, ...]
    config: Any
    metadata: Any
    created_at: str | None
    parent_config: Any
    tasks: tuple[Any, ...]
    interrupts: tuple[Any, ...]


#: A thread's state as a read is given it: the stand-in, or LangGraph's own where LangGraph's graph
#: read the checkpoint (one :class:`ThreadStates` does not read; the worker's graph).
Snapshot: TypeAlias = "StateSnapshot | langgraph.types.StateSnapshot"


def as_langgraph(value: Any) -> Any:
    """``value`` with each stand-in in it (in lists, tuples and dicts, at any depth) as LangGraph's
    own type, for LangGraph's graph to read; anything else as it is (the same object when it holds
    no stand-in). Imports ``langgraph.types``."""
    from langgraph import types

    def convert(item: Any) -> Any:
        if isinstance(item, Send):
            return types.Send(item.node, convert(item.arg), timeout=item.timeout)
        if isinstance(item, Interrupt):
            return types.Interrupt(convert(item.value), item.id, response_schema=item.response_schema)
        if isinstance(item, list):
            items = [convert(i) for i in item]
            return items if any(a is not b for a, b in zip(items, item, strict=True)) else item
        if isinstance(item, tuple) and not hasattr(item, "_fields"):
            items = [convert(i) for i in item]
            return tuple(items) if any(a is not b for a, b in zip(items, item, strict=True)) else item
        if isinstance(item, dict):
            pairs = {k: convert(v) for k, v in item.items()}
            return pairs if any(pairs[k] is not v for k, v in item.items()) else item
        return item

    return convert(value)
