"""The command-line client (``python -m sophos_cli``, ``./sophos COMMAND``) against a real API.

Every command runs as a subprocess against real worker and API processes; the
interactive chat is driven through its standard input, and Ctrl-C is a real SIGINT. The tests that
look only at what they made share one worker and API (``shared_api``).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import httpx
import pytest

from tests.fakes.ollama import Drop, FakeOllama, Hang, Text, ToolCalls
from tests.support.client import get_json, post_chat, read_sse, tool_calls, wait_for
from tests.support.env import SophosEnv, require_approval
from tests.support.stacks import Stack, own_redis_stack

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 30.0
TOKEN = "cli-secret"
COMMANDS = ["chat", "conversations", "show", "export", "rename", "delete", "runs", "cancel", "approve"]
#: the client as these tests run it, which is how its hints name it
CLIENT = shlex.join([sys.executable, "-m", "sophos_cli"])


def cli(env: Mapping[str, str], *args: str, stdin: str | None = None,
        **changes: str | None) -> subprocess.CompletedProcess[str]:
    run_env = {k: v for k, v in {**env, **changes}.items() if v is not None}
    return subprocess.run(
        [sys.executable, "-m", "sophos_cli", *args], env=run_env, cwd=ROOT, input=stdin,
        capture_output=True, text=True, timeout=60,
    )


def ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture
def api(sophos_env: SophosEnv, start_worker, start_api) -> SophosEnv:
    """Worker and API behind a token; the env has SOPHOS_URL and SOPHOS_TOKEN set for the CLI."""
    env = sophos_env.with_(API_TOKEN=TOKEN)
    start_worker(env)
    start_api(env)
    return env.with_(SOPHOS_URL=env.api_url, SOPHOS_TOKEN=TOKEN, API_TOKEN=None)


@pytest.fixture(scope="module")
def shared_stack(tmp_path_factory: pytest.TempPathFactory, fake_ollama: FakeOllama) -> Iterator[Stack]:
    """One worker and API behind the token for the module (tests/support/stacks.py)."""
    with own_redis_stack(tmp_path_factory.mktemp("cli"), fake_ollama, API_TOKEN=TOKEN) as stack:
        yield stack


@pytest.fixture
def shared_api(shared_stack: Stack) -> SophosEnv:
    """:func:`api`, but the module's: for the tests that look only at what they made and leave no run
    going (those that list every conversation, or need the queue empty, have their own)."""
    return shared_stack.env.with_(SOPHOS_URL=shared_stack.api, SOPHOS_TOKEN=TOKEN, API_TOKEN=None)


def converse(env: SophosEnv, message: str, conversation: str | None = None) -> str:
    accepted = post_chat(env.api_url, message, conversation, token=TOKEN)
    assert accepted.status_code == 202, accepted.text
    conversation = accepted.json()["conversation"]
    assert read_sse(env.api_url, conversation, token=TOKEN)[-1].event == "end"
    return str(conversation)


def test_every_command_has_help() -> None:
    assert "COMMAND" in ok(cli({}, "--help")).stdout
    for command in COMMANDS:
        result = ok(cli({}, command, "--help"))
        assert result.stdout.startswith(f"usage: sophos {command}"), result.stdout
        assert "--url" in result.stdout and "--token" in result.stdout


def test_the_token_comes_from_sophos_token_or_api_token_and_a_401_names_the_variable(
    shared_api: SophosEnv,
) -> None:
    api = shared_api
    none = cli(api, "conversations", SOPHOS_TOKEN=None)
    assert none.returncode == 1
    assert "UNAUTHORIZED" in none.stderr and "set SOPHOS_TOKEN to your key" in none.stderr

    wrong = cli(api, "conversations", SOPHOS_TOKEN="wrong")
    assert wrong.returncode == 1 and "The token from SOPHOS_TOKEN was refused" in wrong.stderr
    wrong_api = cli(api, "conversations", SOPHOS_TOKEN=None, API_TOKEN="wrong")
    assert wrong_api.returncode == 1 and "The token from API_TOKEN was refused" in wrong_api.stderr
    flag = cli(api, "conversations", "--token", "wrong")
    assert flag.returncode == 1 and "The token from --token was refused" in flag.stderr

    ok(cli(api, "conversations", SOPHOS_TOKEN=None, API_TOKEN=TOKEN))  # the server's own variable works
    ok(cli(api, "conversations", SOPHOS_TOKEN=TOKEN, API_TOKEN="wrong"))  # SOPHOS_TOKEN comes first
    ok(cli(api, "conversations", "--token", TOKEN, SOPHOS_TOKEN="wrong"))  # and --token before both


def test_conversations_show_and_export(api: SophosEnv, model: FakeOllama) -> None:
    model.script(ToolCalls([("tools__add", {"a": 2, "b": 3})]), Text("The sum is 5."), Text("Hello."))
    summed = converse(api, "add 2 and 3")
    greeted = converse(api, "say hello")

    listing = ok(cli(api, "conversations")).stdout.splitlines()
    assert listing[0].split() == ["CONVERSATION", "STATUS", "MESSAGES", "UPDATED", "TITLE"]
    rows = [row.split()[:3] for row in listing[1:]]
    assert rows == [[greeted, "completed", "2"], [summed, "completed", "4"]]
    assert listing[1].endswith("say hello") and listing[2].endswith("add 2 and 3")
    as_json = json.loads(ok(cli(api, "conversations", "--json")).stdout)
    assert [c["id"] for c in as_json["conversations"]] == [greeted, summed]

    shown = ok(cli(api, "show", summed)).stdout.splitlines()
    assert shown[0] == f"conversation {summed}: add 2 and 3"
    assert shown[1].startswith("status completed, 4 messages, created ")
    assert shown[3:] == [
        "you: add 2 and 3",
        '[tool] tools__add({"a": 2, "b": 3})',
        "[tool] tools__add -> 5",
        "assistant: The sum is 5.",
    ]
    detail = json.loads(ok(cli(api, "show", summed, "--json")).stdout)
    assert detail == get_json(api.api_url, f"/api/conversations/{summed}", token=TOKEN)

    markdown = ok(cli(api, "export", summed)).stdout
    assert markdown == get_json(api.api_url, f"/api/conversations/{summed}/export", token=TOKEN, raw=True)
    assert "The sum is 5." in markdown
    lines = ok(cli(api, "export", summed, "--jsonl")).stdout.splitlines()
    checkpoints = [json.loads(line) for line in lines]
    assert checkpoints and all("checkpoint_id" in c for c in checkpoints)
    assert [m["content"] for c in checkpoints for m in c["messages"]][-1] == "The sum is 5."
    target = api.root / "out.md"
    ok(cli(api, "export", summed, "-o", str(target)))
    assert target.read_text() == markdown

    missing = cli(api, "show", "00000000-0000-4000-8000-000000000000")
    assert missing.returncode == 1 and "NOT_FOUND" in missing.stderr
    bad = cli(api, "export", "not-an-id")
    assert bad.returncode == 1 and "BAD_REQUEST" in bad.stderr
    down = cli(api, "conversations", SOPHOS_URL="http://127.0.0.1:9")
    assert down.returncode == 3 and "cannot reach the API" in down.stderr and "./sophos up" in down.stderr


def test_conversations_page_with_limit_and_cursor(api: SophosEnv, model: FakeOllama) -> None:
    """Needs GET /api/conversations?limit=&cursor= answering nextCursor (the paging route)."""
    made = [converse(api, f"message {i}") for i in range(3)]
    newest_first = made[::-1]
    first = ok(cli(api, "conversations", "--limit", "2"))
    assert [row.split()[0] for row in first.stdout.splitlines()[1:]] == newest_first[:2]
    hint = first.stderr.strip().splitlines()[-1]
    assert hint.startswith(f"more: {CLIENT} conversations --limit 2 --cursor ")
    second = ok(cli(api, *hint.removeprefix(f"more: {CLIENT} ").split()))
    assert [row.split()[0] for row in second.stdout.splitlines()[1:]] == newest_first[2:]
    assert "more:" not in second.stderr
    every = ok(cli(api, "conversations", "--limit", "1", "--all", "--json"))
    assert [c["id"] for c in json.loads(every.stdout)["conversations"]] == newest_first


def test_rename_then_delete(shared_api: SophosEnv, model: FakeOllama) -> None:
    """Needs DELETE /api/conversations/ID (the conversation-deletion route)."""
    api = shared_api
    conversation = converse(api, "forget me")
    renamed = ok(cli(api, "rename", conversation, "Soon gone"))
    assert renamed.stdout == f"conversation {conversation} renamed to 'Soon gone'\n"
    assert "Soon gone" in ok(cli(api, "conversations")).stdout
    blank = cli(api, "rename", conversation, " ")
    assert blank.returncode == 1 and "INVALID_TITLE" in blank.stderr and "empty" in blank.stderr
    deleted = ok(cli(api, "delete", conversation))
    assert conversation in deleted.stdout
    wait_for(
        lambda: httpx.get(f"{api.api_url}/api/conversations/{conversation}", trust_env=False,
                          headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 404,
        timeout=TIMEOUT, message="the conversation gone",
    )
    again = cli(api, "delete", conversation)
    assert again.returncode == 1 and "NOT_FOUND" in again.stderr


def test_chat_reads_the_message_from_standard_input(shared_api: SophosEnv, model: FakeOllama) -> None:
    api = shared_api
    model.script(Text("Piped in."))
    result = ok(cli(api, "chat", "-", stdin="a message\nof two lines\n"))
    assert result.stdout == "Piped in.\n"
    assert model.requests[-1]["messages"][-1] == {"role": "user", "content": "a message\nof two lines"}
    empty = cli(api, "chat", "-", stdin="\n")
    assert empty.returncode == 2 and "the message is empty" in empty.stderr


def test_chat_without_a_terminal_prints_the_waiting_calls_and_the_approve_command(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    require_approval(sophos_env, ["add"])
    start_worker(sophos_env)
    start_api(sophos_env)
    model.script(ToolCalls([("tools__add", {"a": 2, "b": 3})]), ToolCalls([("tools__add", {"a": 4, "b": 4})]))
    result = cli({**sophos_env, "SOPHOS_URL": sophos_env.api_url}, "chat", "add 2 and 3")
    assert result.returncode == 4, result.stderr  # waiting: not a failure, not done either
    conversation = result.stderr.split()[1]
    detail = get_json(sophos_env.api_url, f"/api/conversations/{conversation}")
    [pending] = detail["pendingApproval"]
    assert f'sophos: approval needed: tools__add({{"a": 2, "b": 3}}) id {pending["id"]}\n' in result.stderr
    assert result.stderr.endswith(
        f"sophos: the run waits for a decision on each call; decide with: {CLIENT} approve {conversation}\n"
    )
    assert "the run was waiting" not in result.stderr and "failed" not in result.stderr
    shown = ok(cli({**sophos_env, "SOPHOS_URL": sophos_env.api_url}, "show", conversation)).stdout
    assert f"decide with: {CLIENT} approve {conversation}" in shown

    # Flags decide one round; the next run waits again and, with no terminal, ends the same way.
    again = cli({**sophos_env, "SOPHOS_URL": sophos_env.api_url}, "approve", conversation, "--approve-all")
    assert again.returncode == 4, again.stderr
    assert [c["args"] for c in tool_calls(sophos_env.tools_log, "add")] == [{"a": 2, "b": 3}]
    [next_one] = get_json(sophos_env.api_url, f"/api/conversations/{conversation}")["pendingApproval"]
    assert f'approval needed: tools__add({{"a": 4, "b": 4}}) id {next_one["id"]}' in again.stderr
    assert again.stderr.endswith(f"decide with: {CLIENT} approve {conversation}\n")


def test_ctrl_c_on_a_one_message_chat_stops_watching_and_the_run_goes_on(
    api: SophosEnv, model: FakeOllama
) -> None:
    held = Hang(text="Still going")
    model.script(held)
    session = Session(api, "a long one")
    try:
        session.wait_out("Still going")
        conversation = session.stderr.split()[1]
        running = run_of(api, conversation, "running")
        session.interrupt()
        assert session.wait() == 130, session.stderr
        assert f"stopped watching; run {running['id']} goes on" in session.stderr
        assert get_json(api.api_url, f"/api/runs/{running['id']}", token=TOKEN)["status"] == "running"
    finally:
        session.kill()
        held.release()


class Terminal:
    """A client whose standard input, output and error are a pseudo-terminal we type into."""

    def __init__(self, env: Mapping[str, str], *args: str) -> None:
        master, slave = os.openpty()
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "sophos_cli", *args], env=dict(env), cwd=ROOT,
            stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
        )
        os.close(slave)
        self.master = master
        self.chunks: list[bytes] = []
        self.seen = 0  # how far expect() has read
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 4096)
            except OSError:  # EIO: the client has gone, the terminal is closed
                return
            if not chunk:
                return
            self.chunks.append(chunk)

    @property
    def text(self) -> str:
        return b"".join(self.chunks).decode(errors="replace").replace("\r\n", "\n")

    def expect(self, text: str) -> str:
        """Wait for ``text`` after what was expected before; return what came up to its end."""
        def found() -> int:
            return self.text.find(text, self.seen) + 1

        at = wait_for(found, timeout=TIMEOUT, message=lambda: f"{text!r} on the terminal\n{self.text}") - 1
        came, self.seen = self.text[self.seen:at + len(text)], at + len(text)
        return came

    def type(self, line: str) -> None:
        os.write(self.master, (line + "\n").encode())

    def end_input(self) -> None:
        os.write(self.master, b"\x04")  # Ctrl-D at the start of a line: end of input

    def interrupt(self) -> None:
        self.popen.send_signal(signal.SIGINT)

    def wait(self) -> int:
        code = self.popen.wait(TIMEOUT)
        self._reader.join(5)
        return code

    def close(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(5)
        os.close(self.master)


def test_ctrl_c_at_the_prompt_leaves_with_130_and_ctrl_d_with_0(
    shared_api: SophosEnv, model: FakeOllama
) -> None:
    """docs/cli.md's exit status for "left with Ctrl-C", at the prompt of a terminal (a real SIGINT)."""
    api = shared_api
    model.script(Text("One."))
    terminal = Terminal(api, "chat")
    try:
        terminal.expect("you> ")
        terminal.type("first")
        terminal.expect("One.\n")
        terminal.expect("you> ")  # back at the prompt, waiting for a line
        terminal.interrupt()
        assert terminal.wait() == 130, terminal.text
    finally:
        terminal.close()
    terminal = Terminal(api, "chat")
    try:
        terminal.expect("you> ")
        terminal.end_input()
        assert terminal.wait() == 0, terminal.text
    finally:
        terminal.close()
    assert terminal.text.endswith("you> \n"), repr(terminal.text)  # the shell's prompt on a line of its own


class Session:
    """An interactive ``sophos chat`` whose standard input we type into, its output read as it comes."""

    def __init__(self, env: Mapping[str, str], *args: str) -> None:
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "sophos_cli", "chat", *args], env=dict(env), cwd=ROOT,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
        )
        self.out: list[str] = []
        self.err: list[str] = []
        assert self.popen.stdout is not None and self.popen.stderr is not None
        self._readers = [self._read(self.popen.stdout, self.out), self._read(self.popen.stderr, self.err)]

    @staticmethod
    def _read(stream: IO[str], into: list[str]) -> threading.Thread:
        def run() -> None:
            for chunk in iter(lambda: stream.read(1), ""):
                into.append(chunk)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    @property
    def stdout(self) -> str:
        return "".join(self.out)

    @property
    def stderr(self) -> str:
        return "".join(self.err)

    def type(self, line: str) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write(line + "\n")
        self.popen.stdin.flush()

    def wait_out(self, text: str) -> None:
        wait_for(lambda: text in self.stdout, timeout=TIMEOUT,
                 message=lambda: f"{text!r} on stdout\n{self.stdout}\n{self.stderr}")

    def wait_err(self, text: str) -> None:
        wait_for(lambda: text in self.stderr, timeout=TIMEOUT,
                 message=lambda: f"{text!r} on stderr\n{self.stdout}\n{self.stderr}")

    def interrupt(self) -> None:
        self.popen.send_signal(signal.SIGINT)

    def close_input(self) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.close()

    def wait(self) -> int:
        code = self.popen.wait(TIMEOUT)
        for reader in self._readers:
            reader.join(5)
        return code

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(5)


def run_of(env: SophosEnv, conversation: str, status: str) -> dict[str, Any]:
    found: dict[str, Any] = wait_for(
        lambda: get_json(env.api_url, "/api/runs", token=TOKEN, conversation=conversation,
                         status=status)["runs"],
        timeout=TIMEOUT, message=f"a {status} run of {conversation}",
    )[0]
    return found


def test_interactive_chat_keeps_the_conversation_and_ctrl_c_stops_the_answer(
    api: SophosEnv, model: FakeOllama
) -> None:
    # Held mid-answer and never released: only a cancel that cuts the model call ends the run.
    long_answer = Hang(text="This answer goes on and on")
    model.script(Text("One."), long_answer, Text("Three."))
    session = Session(api)
    try:
        session.type("first")
        session.wait_out("One.\n")
        conversation = session.stderr.split()[1]

        session.type("second")
        session.wait_out("This answer goes on and on")
        running = run_of(api, conversation, "running")
        session.interrupt()  # Ctrl-C: the answer stops, the session does not
        session.wait_err("stopping the answer")
        session.wait_err("the run was cancelled")
        assert get_json(api.api_url, f"/api/runs/{running['id']}", token=TOKEN)["status"] == "cancelled"

        session.type("third")  # the same conversation at once, the history with it
        session.wait_out("Three.\n")
        sent = [m["content"] for m in model.requests[-1]["messages"] if m["role"] == "user"]
        assert sent == ["first", "second", "third"]
        session.close_input()  # end of input leaves
        assert session.wait() == 0, session.stderr
    finally:
        session.kill()
        long_answer.release()
    assert session.stdout.startswith("One.\nThis answer goes on and on")
    messages = get_json(api.api_url, f"/api/conversations/{conversation}", token=TOKEN)["messages"]
    assert [(m["role"], m["content"], m.get("status")) for m in messages] == [
        ("user", "first", None), ("assistant", "One.", None),
        ("user", "second", None), ("assistant", "This answer goes on and on", "stopped"),
        ("user", "third", None), ("assistant", "Three.", None),
    ]
    listing = get_json(api.api_url, "/api/conversations", token=TOKEN)["conversations"]
    assert [c["id"] for c in listing] == [conversation]


def test_interactive_chat_leaves_on_a_second_ctrl_c(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    """A second Ctrl-C while the answer is still stopping leaves (130), the run left to stop."""
    env = sophos_env.with_(API_TOKEN=TOKEN)
    worker = start_worker(env)
    start_api(env)
    held = Hang(text="Holding on")
    model.script(held)
    session = Session(env.with_(SOPHOS_URL=env.api_url, SOPHOS_TOKEN=TOKEN, API_TOKEN=None))
    try:
        session.type("hold")
        session.wait_out("Holding on")
        # A cancel lands at once; a frozen worker keeps the answer stopping for the second Ctrl-C.
        worker.signal(signal.SIGSTOP)
        session.interrupt()
        session.wait_err("stopping the answer (Ctrl-C again leaves)")
        session.interrupt()
        assert session.wait() == 130, session.stderr
    finally:
        worker.signal(signal.SIGCONT)
        session.kill()
        held.release()
    assert "left; run" in session.stderr and "the run was cancelled" not in session.stderr


def _sh_block(page: str, heading: str) -> str:
    """The first ```sh block of the manual's page ``docs/page`` under the heading ``heading`` (any level)."""
    text = (ROOT / "docs" / page).read_text()
    section = re.split(rf"\n#+ {re.escape(heading)}\n", "\n" + text, maxsplit=1)[1]
    return section.split("```sh\n", 1)[1].split("```", 1)[0]


def test_the_readme_examples_run(sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama,
                                 tmp_path: Path) -> None:
    """Every example of the manual's "The command-line client" (docs/cli.md) and "API by example"
    (docs/api.md), run as written (the README's curl lines are a part of the latter).

    The DELETE example needs DELETE /api/conversations/ID (the conversation-deletion route).
    """
    start_worker(sophos_env)
    start_api(sophos_env)
    model.default_text = "Hello from the model."
    shell = {**sophos_env, "SOPHOS_URL": sophos_env.api_url}

    def run(script: str) -> str:
        done = subprocess.run(["bash", "-u", "-o", "pipefail", "-c", script], env=shell, cwd=tmp_path,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
        output = done.stdout + done.stderr
        assert "Traceback" not in output and "INTERNAL" not in output, output
        assert "unbound variable" not in output and "command not found" not in output, output
        return output

    api_block = _sh_block("api.md", "API by example")
    assert api_block.startswith("API=http://127.0.0.1:8000\n")
    answers = run(api_block.replace("API=http://127.0.0.1:8000", f"API={sophos_env.api_url}", 1))
    assert answers.count('data: "model."') == 3  # the stream, then twice resumed after event 3
    assert answers.count('data: "Hello "') == 1
    for expected in ["event: end", "RUN_NOT_RESUMABLE", "# hello", '"checkpoint_id"', "RUN_FINISHED",
                     '{"status":"ok"}', '"status":"ready"', 'sophos_runs_finished_total{status="completed"}',
                     " paths", '"conversations":[', '"branch":{"index":3,"count":3,',
                     '"title":"Greetings","status":"renamed"',
                     '{"model":"test-model","tools":[{"name":"tools__']:
        assert expected in answers, f"{expected!r} not in\n{answers}"

    cli_block = _sh_block("cli.md", "The command-line client")
    cli_block = cli_block.replace("./sophos ", f"{sys.executable} -m sophos_cli ")
    said = run(cli_block)
    for expected in ["Hello from the model.", "CONVERSATION  ", "you: what can you do?", "RUN_NOT_RESUMABLE",
                     "worker: alive", "RUN_FINISHED", "wrote ", "NO_APPROVAL_PENDING",
                     "you: and then?  [branch 2/2]", "renamed to 'Greetings'"]:
        assert expected in said, f"{expected!r} not in\n{said}"
    assert (tmp_path / "conversation.md").read_text().startswith("# what can you do?")
    assert (tmp_path / "conversation.jsonl").read_text().startswith('{"checkpoint_id"')

    # Needs the DELETE route.
    assert "METHOD_NOT_ALLOWED" not in answers + said


# --- what the client says: the command as run, the queue, input that is not text ------------


def launcher_checkout(tmp_path: Path) -> Path:
    """A copy of ``./sophos`` whose .venv is this interpreter, installed already (no pip)."""
    checkout = tmp_path / "checkout"
    (checkout / ".venv" / "bin").mkdir(parents=True)
    for name in ("sophos", "pyproject.toml", "requirements.lock"):
        shutil.copy2(ROOT / name, checkout / name)
    python = checkout / ".venv" / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    python.chmod(0o755)
    (checkout / ".venv" / ".sophos-installed").touch()  # newer than pyproject.toml: nothing to install
    return checkout


def test_hints_name_the_command_as_run_with_its_url_and_token(
    shared_api: SophosEnv, model: FakeOllama, tmp_path: Path
) -> None:
    api = shared_api
    checkout = launcher_checkout(tmp_path)
    model.script(Drop(after_tokens=2))
    env = {**api.with_(SOPHOS_URL=None, SOPHOS_TOKEN=None), "PYTHONPATH": str(ROOT)}
    failed = subprocess.run(
        ["./sophos", "chat", "hello", "--url", api.api_url, "--token", TOKEN], env=env, cwd=checkout,
        capture_output=True, text=True, timeout=60,
    )
    assert failed.returncode == 1, failed.stderr
    conversation = failed.stderr.split()[1]
    # The model went away mid-answer: the run can be resumed, and the line that does it is printed.
    assert "the run failed: MODEL_UNAVAILABLE" in failed.stderr
    hint = failed.stderr.strip().splitlines()[-1]
    command = f"./sophos chat --resume --conversation {conversation} --url {api.api_url} --token {TOKEN}"
    assert hint == f"sophos: resume it with: {command}"

    model.script(Text("Whole now."))
    resumed = subprocess.run(shlex.split(command), env=env, cwd=checkout, capture_output=True, text=True,
                             timeout=60)
    assert resumed.returncode == 0 and resumed.stdout == "Whole now.\n", resumed.stderr


def test_a_queued_chat_says_its_place_until_it_starts(api: SophosEnv, model: FakeOllama) -> None:
    held = Hang(text="first")
    model.script(held, Text("Second, after the wait."))
    post_chat(api.api_url, "hold the worker", token=TOKEN)
    held.wait_started(TIMEOUT)
    waiting = subprocess.Popen(
        [sys.executable, "-m", "sophos_cli", "chat", "wait your turn"], env=dict(api), cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        wait_for(lambda: get_json(api.api_url, "/api/runs", token=TOKEN, status="queued")["runs"],
                 timeout=TIMEOUT, message="the chat's run queued")
        held.release()
        out, err = waiting.communicate(timeout=TIMEOUT)
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.communicate()
    assert waiting.returncode == 0, err
    assert out == "Second, after the wait.\n"
    assert "sophos: queued (position 1)\n" in err


@pytest.mark.parametrize("decoding", ["utf-8:strict", "utf-8:surrogateescape"])
def test_input_that_is_not_utf8_is_one_line_and_exit_2(decoding: str) -> None:
    """Refused before any request (no API here): from standard input, at the prompt, as an argument.
    Python reads standard input strictly in a UTF-8 locale, keeping bad bytes as surrogates in others."""
    env = {"PATH": os.environ["PATH"], "LC_ALL": "C.UTF-8", "PYTHONIOENCODING": decoding,
           "SOPHOS_URL": "http://127.0.0.1:9"}
    for args, given in ((["chat", "-"], b"caf\xe9 au lait\n"), (["chat"], b"caf\xe9\n"),
                        ([b"chat", b"caf\xe9"], None)):
        done = subprocess.run([sys.executable, "-m", "sophos_cli", *args], env=env, cwd=ROOT, input=given,
                              capture_output=True, timeout=60)
        err = done.stderr.decode()
        assert done.returncode == 2, err
        assert "Traceback" not in err and err.count("\n") == 1, err
        assert "is not UTF-8 text" in err
