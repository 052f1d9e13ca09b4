"""What the API takes from a request before any lookup: ids, cursors, idempotency keys, times."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator

import pytest

from api.auth.identity import LOCAL, bind, unbind
from api.chat.idempotency import idempotency_of
from api.chat.schemas import ChatRequest
from api.http.ids import parse_id
from api.http.timefmt import millis_between, parse_iso
from api.runs.views import CURSOR_MAX_CHARS, decode_cursor, encode_cursor
from shared.errors import BadRequest

RUN = "0b6c2f1e-3d4a-4b5c-8d9e-0f1a2b3c4d5e"


@pytest.fixture(autouse=True)
def local_caller() -> Iterator[None]:
    """An Idempotency-Key is its caller's (api/auth/identity.py): these parse as the local user's."""
    token = bind(LOCAL)
    yield
    unbind(token)

AT = "2026-01-02T03:04:05.678901+00:00"


def test_an_id_is_a_uuid_given_back_in_lower_case() -> None:
    assert parse_id(RUN.upper(), "run") == RUN
    for bad, said in [(None, "run is required"), ("", "run is required"), ("42", "run must be a UUID"),
                      (RUN + "0", "run must be a UUID"), (" " + RUN, "run must be a UUID")]:
        with pytest.raises(BadRequest, match=said):
            parse_id(bad, "run")


def test_a_long_refused_id_is_quoted_short() -> None:
    with pytest.raises(BadRequest) as refused:
        parse_id("x" * 10_000, "conversation")
    assert len(str(refused.value)) < 200


def test_a_cursor_comes_back_as_the_key_it_was_made_of() -> None:
    cursor = encode_cursor((AT, RUN))
    assert "=" not in cursor and len(cursor) <= CURSOR_MAX_CHARS
    assert decode_cursor(cursor) == (AT, RUN)
    assert decode_cursor(encode_cursor((AT, RUN.upper()))) == (AT, RUN)


def _raw(value: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "cursor",
    [
        "",
        "not base64 at all!",
        _raw([AT]),
        _raw([AT, RUN, "more"]),
        _raw({"at": AT, "id": RUN}),
        _raw([12, RUN]),
        _raw(["yesterday", RUN]),
        _raw([AT, "not-a-uuid"]),
        _raw([AT, None]),
        "W" * (CURSOR_MAX_CHARS + 1),
        _raw(json.loads("[" * 60 + "]" * 60)),  # nested, and short enough to be decoded
    ],
)
def test_a_cursor_not_given_out_is_refused_naming_the_cursor(cursor: str) -> None:
    with pytest.raises(BadRequest, match="cursor is not one this API gave out"):
        decode_cursor(cursor)


def test_an_idempotency_key_fingerprints_what_the_request_asks() -> None:
    hello = ChatRequest(message="hello")
    assert idempotency_of(None, hello, None) is None
    first = idempotency_of("key-1", hello, None)
    assert first is not None and first.key == "key-1"
    assert idempotency_of("key-1", ChatRequest(message="hello"), None) == first  # a retry
    assert idempotency_of("key-2", hello, None).fingerprint == first.fingerprint  # type: ignore[union-attr]
    others = [
        idempotency_of("key-1", ChatRequest(message="hello!"), None),
        idempotency_of("key-1", hello, RUN),
        idempotency_of("key-1", ChatRequest(conversation=RUN, resume=True), RUN),
    ]
    assert len({o.fingerprint for o in others if o is not None} | {first.fingerprint}) == 4


@pytest.mark.parametrize("key", ["", " ", "a b", "é", "x" * 256, "tab\there"])
def test_an_idempotency_key_is_visible_ascii_up_to_255(key: str) -> None:
    with pytest.raises(BadRequest, match="Idempotency-Key"):
        idempotency_of(key, ChatRequest(message="hello"), None)
    assert idempotency_of("!~" + "k" * 253, ChatRequest(message="hello"), None) is not None


def test_times_are_iso_and_durations_never_negative() -> None:
    assert parse_iso(AT) is not None and parse_iso(None) is None and parse_iso("") is None
    assert parse_iso("not a time") is None
    assert millis_between(AT, "2026-01-02T03:04:06.678901+00:00") == 1000
    assert millis_between("2026-01-02T03:04:06+00:00", AT) == 0  # clocks apart: never below 0
    assert millis_between(AT, None) is None and millis_between("junk", AT) is None


def test_an_idempotency_key_is_its_callers() -> None:
    from api.auth.identity import Caller
    from shared.redis.keys import idempotency_key

    asked = ChatRequest(message="hi")
    mine = idempotency_of("k", asked, None)
    token = bind(Caller("bob", operator=False, how="key"))
    try:
        bobs = idempotency_of("k", asked, None)
    finally:
        unbind(token)
    assert mine is not None and bobs is not None and mine.fingerprint == bobs.fingerprint
    assert idempotency_key(mine.key, mine.owner) != idempotency_key(bobs.key, bobs.owner)
    # A NUL keeps a name with a colon apart from a key with one.
    assert idempotency_key("b:c", "a") != idempotency_key("c", "a:b")
