"""Tokens written together (issue 45): one stream entry ``<first>-<k>`` holds events first..first+k,
each still its own SSE event with its own id. The codec (shared/contracts/events.py) and the
relay's encoding (api/chat/relay.py), without a process."""

from __future__ import annotations

import pytest

from api.chat.feed import make_entry
from api.chat.relay import _encode
from shared.contracts.codec import dumps, loads
from shared.contracts.events import EventType, entry_events, entry_fields, entry_id, entry_span
from tests.support.client import SseParser

pytestmark = pytest.mark.fast


def _stored(first: int, type_: EventType, items: list[object]) -> tuple[str, dict[str, str]]:
    """An entry as Redis gives it back (decoded strings)."""
    fields = entry_fields(type_, [dumps(item) for item in items])
    decoded = {k: v.decode() if isinstance(v, bytes) else v for k, v in fields.items()}
    return entry_id(first, len(items)), decoded


def _events(chunk: bytes) -> list[tuple[str | None, str, object]]:
    parsed = SseParser().feed_lines(chunk.decode().split("\r\n"))
    return [(e.id, e.event, loads(e.raw)) for e in parsed]


def test_an_entry_of_tokens_is_its_tokens_each_with_its_own_id() -> None:
    texts = ["Hel", "lo, ", "\"world\"\n", "", "é🙂"]
    raw_id, fields = _stored(7, EventType.TOKEN, list(texts))
    assert raw_id == "7-4" and entry_span(raw_id) == (7, 11) and entry_span(b"7-4") == (7, 11)
    assert [(n, t, loads(d)) for n, t, d in entry_events(raw_id, fields)] == [
        (7 + i, "token", text) for i, text in enumerate(texts)
    ]
    # One event alone is what it always was: entry n-0, its data the event's JSON.
    raw_id, fields = _stored(3, EventType.TRACE, [{"step": 1}])
    assert raw_id == "3-0" and fields == {"type": "trace", "data": '{"step":1}'}
    assert entry_events(raw_id, fields) == [(3, "trace", '{"step":1}')]
    with pytest.raises(ValueError, match="only token events"):
        entry_fields(EventType.TRACE, [b"1", b"2"])


def test_the_relay_resumes_inside_an_entry_and_names_a_gap() -> None:
    entries = [
        make_entry(*_stored(1, EventType.TRACE, [{"step": 1}])),
        make_entry(*_stored(2, EventType.TOKEN, ["a", "b", "c", "d"])),  # events 2..5
        make_entry(*_stored(6, EventType.END, [{"status": "completed"}])),
    ]
    whole = _events(_encode(entries, 0)[0])
    assert [e[0] for e in whole] == ["1", "2", "3", "4", "5", "6"]
    for pos in range(0, 6):  # a reconnect after any event, inside the entry of tokens too
        chunk, new_pos, count, done = _encode(entries, pos)
        assert _events(chunk) == whole[pos:] and (new_pos, count, done) == (6, 6 - pos, True)
    # The entry of tokens was trimmed: what is missing is said, never skipped silently.
    chunk, pos, _, _ = _encode([entries[2]], 1)
    assert _events(chunk) == [("5", "missed", {"from": 2, "to": 5}), whole[5]] and pos == 6
