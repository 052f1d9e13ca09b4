"""``sophos approve`` and ``sophos chat``'s questions against the real API and worker processes.

The fake tools server logs every call it executes before doing its work, so "never
executed" is checked on the tool's side; the questions are answered through a real
pseudo-terminal. The module's tests share one worker and API (each in conversations of its own).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from typing import Any

import pytest

from tests.fakes.ollama import FakeOllama, Text, ToolCalls
from tests.support.client import chat, get_json, tool_calls, wait_for
from tests.support.env import SophosEnv
from tests.support.stacks import approval_stack
from tests.test_approvals import wait_approval
from tests.test_cli import CLIENT, Session, Terminal, cli, ok


@pytest.fixture(scope="module")
def shared_stack(tmp_path_factory: pytest.TempPathFactory, fake_ollama: FakeOllama) -> Iterator[SophosEnv]:
    """One worker and API for the module (tests/support/stacks.py), ``add`` needing approval: each
    test works in conversations of its own."""
    with approval_stack(tmp_path_factory.mktemp("cli-approve"), fake_ollama) as env:
        yield env


@pytest.fixture
def stack(shared_stack: SophosEnv) -> SophosEnv:
    """The module's worker and API, the tools' log emptied (so it holds this test's calls only); the
    env has SOPHOS_URL for the CLI."""
    shared_stack.tools_log.write_text("")
    return shared_stack.with_(SOPHOS_URL=shared_stack.api_url)


def waiting(env: SophosEnv, message: str) -> tuple[str, list[dict[str, Any]]]:
    conversation, _ = chat(env.api_url, message)
    return conversation, wait_approval(env.api_url, conversation)


def pending(env: SophosEnv, conversation: str) -> Any:
    return get_json(env.api_url, f"/api/conversations/{conversation}")["pendingApproval"]


def test_approve_from_flags_runs_the_call_and_follows_the_answer(stack: SophosEnv, model: FakeOllama) -> None:
    model.script(ToolCalls([("tools__add", {"a": 2, "b": 3})]), Text("The sum is 5."))
    conversation, [request] = waiting(stack, "add 2 and 3")
    result = ok(cli(stack, "approve", conversation, "--approve", request["id"]))
    assert result.stdout == "[tool] tools__add -> 5\nThe sum is 5.\n"
    assert f"sophos: decided: approve tools__add id {request['id']}\n" in result.stderr
    assert [c["args"] for c in tool_calls(stack.tools_log, "add")] == [{"a": 2, "b": 3}]
    assert pending(stack, conversation) is None


def test_reject_with_a_reason_never_runs_the_call_and_the_model_hears_it(
    stack: SophosEnv, model: FakeOllama
) -> None:
    model.script(ToolCalls([("tools__add", {"a": 1, "b": 1}), ("tools__add", {"a": 2, "b": 2})]),
                 Text("Understood."))
    conversation, [first, second] = waiting(stack, "two sums")
    result = ok(cli(stack, "approve", conversation, "--reject", f"{first['id']}=not today",
                    "--reject", second["id"], "--message", "nor that one"))
    assert result.stdout == "Understood.\n"
    assert tool_calls(stack.tools_log) == []
    told = [m["content"] for m in model.requests[1]["messages"] if m["role"] == "tool"]
    assert len(told) == 2 and all("rejected" in t for t in told)
    assert "not today" in told[0] and "nor that one" in told[1]
    assert f"decided: reject tools__add id {second['id']}: nor that one" in result.stderr


def test_edit_runs_with_the_new_arguments_and_bad_json_posts_nothing(
    stack: SophosEnv, model: FakeOllama
) -> None:
    model.script(ToolCalls([("tools__add", {"a": 2, "b": 3})]), Text("The sum is 50."))
    conversation, [request] = waiting(stack, "add 2 and 3")
    bad = cli(stack, "approve", conversation, "--edit", request["id"], '{"a": 20,')
    assert bad.returncode == 2, bad.stderr
    assert f"sophos: --edit {request['id']}: not valid JSON (" in bad.stderr
    not_object = cli(stack, "approve", conversation, "--edit", request["id"], "[20, 30]")
    assert not_object.returncode == 2 and "the arguments must be a JSON object" in not_object.stderr
    assert pending(stack, conversation) == [request] and len(model.requests) == 1  # nothing posted

    result = ok(cli(stack, "approve", conversation, "--edit", request["id"], '{"a": 20, "b": 30}'))
    assert result.stdout.endswith("The sum is 50.\n")
    assert [c["args"] for c in tool_calls(stack.tools_log, "add")] == [{"a": 20, "b": 30}]
    assert model.requests[1]["messages"][-1]["content"] == "50"


def test_an_id_not_pending_or_a_call_left_undecided_is_refused_before_anything_is_posted(
    stack: SophosEnv, model: FakeOllama
) -> None:
    model.script(ToolCalls([("tools__add", {"a": 1, "b": 1}), ("tools__add", {"a": 2, "b": 2})]),
                 Text("Both."))
    conversation, [first, second] = waiting(stack, "two sums")
    unknown = cli(stack, "approve", conversation, "--approve", "nope", "--approve-all")
    assert unknown.returncode == 2, unknown.stderr
    assert "sophos: not pending: nope. The pending calls: " in unknown.stderr
    assert first["id"] in unknown.stderr and second["id"] in unknown.stderr
    undecided = cli(stack, "approve", conversation, "--approve", first["id"])  # no terminal to ask on
    assert undecided.returncode == 2 and f"no decision for: {second['id']} tools__add" in undecided.stderr
    twice = cli(stack, "approve", conversation, "--approve", first["id"], "--reject", first["id"])
    assert twice.returncode == 2 and "decided twice" in twice.stderr
    bare = cli(stack, "approve", conversation)
    assert bare.returncode == 2 and "standard input is not a terminal" in bare.stderr
    assert f"approval needed: tools__add({{\"a\": 1, \"b\": 1}}) id {first['id']}" in bare.stderr
    assert pending(stack, conversation) == [first, second]
    assert len(model.requests) == 1 and tool_calls(stack.tools_log) == []

    ok(cli(stack, "approve", conversation, "--approve", first["id"], "--reject-all", "-m", "only that one"))
    assert [c["args"] for c in tool_calls(stack.tools_log, "add")] == [{"a": 1, "b": 1}]
    told = [m["content"] for m in model.requests[1]["messages"] if m["role"] == "tool"]
    assert len(told) == 2 and "2" in told  # the rejection is told first, then the result
    assert any("rejected" in t and "only that one" in t for t in told)


def test_nothing_pending_prints_the_apis_409(stack: SophosEnv, model: FakeOllama) -> None:
    model.script(Text("No tools needed."))
    result = ok(cli(stack, "chat", "hello"))
    conversation = result.stderr.split()[1]
    for args in ([], ["--approve-all"], ["--approve", "x"]):
        refused = cli(stack, "approve", conversation, *args)
        assert refused.returncode == 1, refused.stderr
        assert refused.stderr == (f"sophos: NO_APPROVAL_PENDING: conversation {conversation} "
                                  "has no approval pending\n")
    missing = cli(stack, "approve", "00000000-0000-4000-8000-000000000000")
    assert missing.returncode == 1 and "NOT_FOUND" in missing.stderr


def test_the_printed_command_asks_on_a_terminal_and_asks_again_when_the_next_run_waits(
    stack: SophosEnv, model: FakeOllama
) -> None:
    model.script(ToolCalls([("tools__add", {"a": 2, "b": 3})]), ToolCalls([("tools__add", {"a": 5, "b": 5})]),
                 Text("Done."))
    waited = cli(stack, "chat", "add twice")
    assert waited.returncode == 4, waited.stderr
    command = waited.stderr.strip().splitlines()[-1].split("decide with: ", 1)[1]
    conversation = waited.stderr.split()[1]
    assert command == f"{CLIENT} approve {conversation}"

    terminal = Terminal(stack, *shlex.split(command.removeprefix(CLIENT)))
    try:
        terminal.expect('approval needed: tools__add({"a": 2, "b": 3})')
        terminal.expect("[a/r/e] ")
        terminal.type("e")
        terminal.expect('arguments now: {"a": 2, "b": 3}')
        terminal.expect("new arguments as JSON (empty: back): ")
        terminal.type("")  # empty: back to the choice
        terminal.expect("[a/r/e] ")
        terminal.type("edit")
        terminal.expect("new arguments as JSON (empty: back): ")
        terminal.type("{oops")
        terminal.expect("not valid JSON (")
        terminal.expect("try again")
        terminal.expect("new arguments as JSON (empty: back): ")  # asked again
        terminal.type('{"a": 1, "b": 1}')
        # The next run waits again: asked again, in the same command.
        terminal.expect('approval needed: tools__add({"a": 5, "b": 5})')
        terminal.expect("[a/r/e] ")
        terminal.type("maybe")
        terminal.expect("answer a (approve), r (reject) or e (edit)")
        terminal.expect("[a/r/e] ")
        terminal.type("r")
        terminal.expect("reason, told to the model (empty: none): ")
        terminal.type("enough sums")
        terminal.expect("Done.\n")
        assert terminal.wait() == 0, terminal.text
    finally:
        terminal.close()
    assert [c["args"] for c in tool_calls(stack.tools_log, "add")] == [{"a": 1, "b": 1}]
    last = model.requests[2]["messages"][-1]
    assert last["role"] == "tool" and "enough sums" in last["content"]
    assert pending(stack, conversation) is None


def test_chat_at_the_prompt_asks_then_goes_on_in_the_same_conversation(
    stack: SophosEnv, model: FakeOllama
) -> None:
    model.script(ToolCalls([("tools__add", {"a": 2, "b": 3})]), Text("The sum is 5."), Text("Bye."))
    terminal = Terminal(stack, "chat")
    try:
        terminal.expect("you> ")
        terminal.type("add 2 and 3")
        terminal.expect('approval needed: tools__add({"a": 2, "b": 3})')
        terminal.expect("[a/r/e] ")
        terminal.type("a")
        terminal.expect("The sum is 5.\n")
        terminal.expect("you> ")
        terminal.type("thanks")
        terminal.expect("Bye.\n")
        terminal.expect("you> ")
        terminal.end_input()
        assert terminal.wait() == 0, terminal.text
    finally:
        terminal.close()
    assert [c["args"] for c in tool_calls(stack.tools_log, "add")] == [{"a": 2, "b": 3}]
    sent = [m["content"] for m in model.requests[-1]["messages"] if m["role"] == "user"]
    assert sent == ["add 2 and 3", "thanks"]


def test_leaving_the_questions_posts_nothing_and_says_the_command(
    stack: SophosEnv, model: FakeOllama
) -> None:
    model.script(ToolCalls([("tools__add", {"a": 2, "b": 3})]), Text("The sum is 5."))
    conversation, [request] = waiting(stack, "add 2 and 3")
    for leave, code in (("end of input", 4), ("Ctrl-C", 130)):
        terminal = Terminal(stack, "approve", conversation)
        try:
            terminal.expect("[a/r/e] ")
            if leave == "Ctrl-C":
                terminal.interrupt()  # a real SIGINT
            else:
                terminal.end_input()
            assert terminal.wait() == code, terminal.text
        finally:
            terminal.close()
        decide = f"Decide with: {CLIENT} approve {conversation}"
        assert f"no decision sent; the conversation still waits. {decide}" in terminal.text
        assert pending(stack, conversation) == [request]
    assert len(model.requests) == 1 and tool_calls(stack.tools_log) == []


def test_lines_piped_into_the_prompt_answer_the_questions_and_end_of_input_while_waiting_exits_4(
    stack: SophosEnv, model: FakeOllama
) -> None:
    model.script(ToolCalls([("tools__add", {"a": 2, "b": 3})]), Text("The sum is 5."),
                 ToolCalls([("tools__add", {"a": 7, "b": 7})]))
    session = Session(stack)
    try:
        session.type("add 2 and 3")
        session.wait_err("[a/r/e] ")
        session.type("a")
        session.wait_out("The sum is 5.\n")
        conversation = session.stderr.split()[1]
        session.type("add 7 and 7")
        wait_for(lambda: session.stderr.count("[a/r/e] ") == 2, timeout=30, message=lambda: session.stderr)
        session.close_input()  # left undecided: nothing posted, the conversation waits
        assert session.wait() == 4, session.stderr
    finally:
        session.kill()
    assert f"Decide with: {CLIENT} approve {conversation} (or /approve here)" in session.stderr
    assert [c["args"] for c in tool_calls(stack.tools_log, "add")] == [{"a": 2, "b": 3}]
    assert [r["arguments"] for r in pending(stack, conversation)] == [{"a": 7, "b": 7}]
