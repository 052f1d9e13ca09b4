"""The strict checkpoint serializer of the API's reader processes (shared/storage/reading.py).

Its own module so that what imports the reading side (the API's main process) does not load
LangGraph: only a reader process, reading a thread, imports this.
"""

from __future__ import annotations

from typing import Any

from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from shared.storage import CheckpointDecodeError


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
        # Strict deserialization whatever the environment says (as for the async saver).
        super().__init__(allowed_msgpack_modules=None)
        self._decoded: dict[tuple[str, bytes], Any] = {}

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        if not isinstance(data[1], bytes):
            return super().loads_typed(data)
        try:
            return self._decoded[data]
        except KeyError:
            value = self._decoded[data] = super().loads_typed(data)
            return value
