"""The reader's serializer decodes a stored full copy of the messages when it is first read
(shared/storage/threads/decoding.py ``lazy_snapshot_ext_hook``): listing a thread then costs
what its checkpoints hold but those copies, which the JSON Lines export mostly reads from the
writes instead (tests/test_lazy_snapshots.py)."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.serde.types import _DeltaSnapshot

from shared.storage import CheckpointDecodeError
from shared.storage.threads.decoding import DecodedOnce


def _messages(count: int) -> list[object]:
    return [(HumanMessage if i % 2 else AIMessage)(f"m{i}", id=f"id{i}") for i in range(count)]


# 0 and 15: a fixarray's header; 16 and 65,535: array 16; 65,536: array 32.
@pytest.mark.parametrize("count", [0, 1, 15, 16, 200, 65_535, 65_536])
def test_a_copy_is_decoded_when_first_read_and_as_langgraph_decodes_it(count: int) -> None:
    eager = JsonPlusSerializer(allowed_msgpack_modules=None)
    messages = _messages(min(count, 300)) + ["x"] * max(0, count - 300)
    blob = eager.dumps_typed({"channel_values": {"messages": _DeltaSnapshot(messages)}, "v": 4})
    held = DecodedOnce().loads_typed(blob)["channel_values"]["messages"]
    assert isinstance(held, _DeltaSnapshot)
    assert held.length == count and not held.decoded  # its length read from its header alone
    assert held.value == eager.loads_typed(blob)["channel_values"]["messages"].value and held.decoded


def test_a_damaged_copy_fails_as_the_conversations_fault_when_read() -> None:
    import ormsgpack

    code = 7  # LangGraph's EXT_DELTA_SNAPSHOT (tests/fast/test_compat.py)
    damaged = ormsgpack.packb({"messages": ormsgpack.Ext(code, b"\xdc\x00\x05\xc1")})
    held = DecodedOnce().loads_typed(("msgpack", damaged))["messages"]
    assert held.length == 5
    with pytest.raises(CheckpointDecodeError):
        _ = held.value
