"""The strict checkpoint serializer of the API's reader processes (shared/storage/reading.py).

Its own module so that what imports the reading side (the API's main process) does not load
LangGraph: only a reader process, reading a thread, imports this.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import ormsgpack
from langgraph.checkpoint.serde.jsonplus import (
    EXT_CONSTRUCTOR_KW_ARGS,
    EXT_CONSTRUCTOR_POS_ARGS,
    JsonPlusSerializer,
)

from shared.compat import delta_snapshot_code, lazy_delta_snapshot, strict_serializer_options
from shared.storage import CheckpointDecodeError
from shared.storage.threads.stand_ins import Interrupt, Send

ExtHook = Callable[[int, bytes], Any]
_TYPES = "langgraph.types"
_INTERRUPT_FIELDS = frozenset({"value", "id", "response_schema"})


def _head(code: int, data: bytes) -> None:
    """What an ext value nested in the one being looked at decodes to while only its head (the
    module and the name of its type) is read."""


def _stand_in(code: int, data: bytes, hook: ExtHook) -> Send | Interrupt | None:
    """The stand-in of the ext value ``data`` (its parts decoded by ``hook``), if it is a ``Send``
    or an ``Interrupt`` as LangGraph writes them (``jsonplus._msgpack_default``), else None."""
    module, name = ormsgpack.unpackb(data, ext_hook=_head, option=ormsgpack.OPT_NON_STR_KEYS)[:2]
    if module != _TYPES or name not in ("Send", "Interrupt"):
        return None
    args = ormsgpack.unpackb(data, ext_hook=hook, option=ormsgpack.OPT_NON_STR_KEYS)[2]
    if code == EXT_CONSTRUCTOR_POS_ARGS and name == "Send" and len(args) in (2, 3):
        return Send(*args)
    if (
        code == EXT_CONSTRUCTOR_KW_ARGS and name == "Interrupt" and isinstance(args, dict)
        and {"value", "id"} <= args.keys() <= _INTERRUPT_FIELDS
    ):
        return Interrupt(**args)
    return None


def stand_in_ext_hook(langgraph_hook: ExtHook) -> ExtHook:
    """``langgraph_hook`` (LangGraph's msgpack decoding of ext values), except that a ``Send``
    and an ``Interrupt`` of ``langgraph.types`` decode as shared/storage/threads/stand_ins.py's,
    which import nothing: LangGraph's would import ``langgraph.types`` and with it
    ``langchain_core.runnables``, langsmith and OpenTelemetry (~18 MB a reader process).

    Both are among LangGraph's types that strict deserialization allows; anything else, and a
    ``Send`` or ``Interrupt`` of a shape this does not know, is LangGraph's to decode.
    """

    def hook(code: int, data: bytes) -> Any:
        if code in (EXT_CONSTRUCTOR_POS_ARGS, EXT_CONSTRUCTOR_KW_ARGS):
            try:
                stand_in = _stand_in(code, data, hook)
            except Exception:  # not of a shape LangGraph writes: LangGraph's to make sense of
                stand_in = None
            if stand_in is not None:
                return stand_in
        return langgraph_hook(code, data)

    return hook


def _list_length(data: bytes) -> int | None:
    """The length of the msgpack array ``data`` begins with (its header), or None."""
    head = data[0] if data else -1
    if 0x90 <= head <= 0x9F:
        return head & 0x0F
    if head in (0xDC, 0xDD):
        size = 2 if head == 0xDC else 4
        return int.from_bytes(data[1 : 1 + size], "big") if len(data) > size else None
    return None


#: a msgpack ext value's header: its first byte → (bytes before its code, bytes before its data)
_EXT_HEADS = {
    **dict.fromkeys((0xD4, 0xD5, 0xD6, 0xD7, 0xD8), (1, 2)),  # fixext 1, 2, 4, 8, 16
    0xC7: (2, 3), 0xC8: (3, 4), 0xC9: (5, 6),  # ext 8, 16, 32
}


def snapshot_head(kind: str, head: bytes | None) -> tuple[bool, int | None]:
    """Whether a stored value of type ``kind`` whose first bytes are ``head`` is a DeltaChannel's
    full copy (a ``_DeltaSnapshot``, msgpack ext code :func:`shared.compat.delta_snapshot_code`),
    and if so its length as :func:`lazy_snapshot_ext_hook` reads it from the whole value (None if
    not a list, or ``head`` too short to tell)."""
    if kind != "msgpack" or not head or head[0] not in _EXT_HEADS:
        return False, None
    code_at, data_at = _EXT_HEADS[head[0]]
    if len(head) <= code_at or head[code_at] != delta_snapshot_code():
        return False, None
    return True, _list_length(head[data_at:])


def _decode_later(data: bytes, hook: ExtHook) -> Any:
    try:
        return ormsgpack.unpackb(data, ext_hook=hook, option=ormsgpack.OPT_NON_STR_KEYS)
    except Exception as exc:
        raise CheckpointDecodeError(f"{type(exc).__name__}: {exc}") from exc


def lazy_snapshot_ext_hook(langgraph_hook: ExtHook) -> ExtHook:
    """``langgraph_hook``, except that a DeltaChannel's stored full copy (a ``_DeltaSnapshot``)
    is decoded when its value is first read (:func:`shared.compat.lazy_delta_snapshot`): the
    JSON Lines export reads most of a thread's copies from the writes instead
    (shared/storage/threads/history.py, :func:`path`), and a copy holds the whole message list
    so far (bench figure 24: listing a 2,000-message thread decoded ~43,000 messages)."""
    code = delta_snapshot_code()

    def hook(kind: int, data: bytes) -> Any:
        if kind == code:
            return lazy_delta_snapshot(partial(_decode_later, data, hook), _list_length(data))
        return langgraph_hook(kind, data)

    return hook


def _reader_ext_hook(langgraph_hook: ExtHook) -> ExtHook:
    return lazy_snapshot_ext_hook(stand_in_ext_hook(langgraph_hook))


class DecodingSerializer(JsonPlusSerializer):
    """The strict serializer, its failures told apart from the connection's.

    The saver decodes inside the same call that queries, so an error from a
    closed or broken connection and one from a damaged blob arrive the same way;
    only the second is the conversation's fault (CONVERSATION_UNREADABLE).
    """

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        try:
            return super().loads_typed(data)
        except Exception as exc:
            raise CheckpointDecodeError(f"{type(exc).__name__}: {exc}") from exc


class DecodedOnce(DecodingSerializer):
    """The strict serializer, decoding each stored blob once per read.

    Rebuilding a thread's state at a checkpoint replays the writes since the last
    full copy of its messages, so reading its whole history (the JSON Lines export)
    decodes each write again for every checkpoint after it, up to ~100 times: a
    400-message export spent 90% of its time building the same messages again
    (measured: 14.3 s → 2.0 s under load). What is decoded is only read, never
    changed, so one object per blob can serve every checkpoint.
    """

    def __init__(self) -> None:
        # Strict deserialization whatever the environment says (as for the async saver); a
        # tool call's Send and an approval's Interrupt as stand-ins (stand_in_ext_hook); a stored
        # copy of the messages decoded when first read (lazy_snapshot_ext_hook).
        super().__init__(**strict_serializer_options(_reader_ext_hook))
        self._decoded: dict[tuple[str, bytes], Any] = {}

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        if not isinstance(data[1], bytes):
            return super().loads_typed(data)
        try:
            return self._decoded[data]
        except KeyError:
            value = self._decoded[data] = super().loads_typed(data)
            return value
