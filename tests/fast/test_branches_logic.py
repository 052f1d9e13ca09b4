"""Which calls of a branch a fork names as having acted (api/chat/branches.py), without a process."""

from __future__ import annotations

from api.chat.branches import Call, Fork, Found, acting, annotate
from api.conversations.ledger_view import LedgerRow
from api.conversations.schemas import Message


def row(message_id: str, call_id: str, safe: bool | None) -> LedgerRow:
    return LedgerRow(message_id, call_id, "tools__echo", f"key-{call_id}", 1, "done", safe)


def test_a_call_acted_when_it_was_sent_and_its_tool_is_not_known_safe_to_repeat() -> None:
    calls = [
        Call("m1", "sent", "tools__echo", {"text": "x"}),
        Call("m1", "read-only", "fetch__fetch", {"url": "u"}),
        Call("m1", "recorded-before", "tools__echo", {}),
        Call("m2", "never-sent", "tools__echo", {}),
    ]
    ledger = [row("m1", "sent", False), row("m1", "read-only", True), row("m1", "recorded-before", None)]
    assert [c.id for c in acting(calls, ledger)] == ["sent", "recorded-before"]


def test_the_fork_shows_on_the_first_message_of_the_branch_followed() -> None:
    first = Found(Message(id="a", role="user", content="one"), "h1", [Call("x", "c1", "tools__echo", {})])
    second = Found(Message(id="b", role="user", content="uno"), "h2", [])
    fork = Fork("p", 1, [first, second])
    shown = [Message(id="b", role="user", content="uno"), Message(id="z", role="assistant", content="!")]
    annotate(shown, [fork], [row("x", "c1", False)])
    branch = shown[0].branch
    assert branch and (branch.index, branch.count) == (2, 2)
    assert [a.message for a in branch.alternatives] == ["a", "b"]
    assert [c.id for c in branch.alternatives[0].acting_calls] == ["c1"]
    assert not shown[1].branch
