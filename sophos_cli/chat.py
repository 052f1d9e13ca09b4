"""``sophos chat``: a message (or standard input), a resume, another answer, or a prompt."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sophos_cli.approve import Reader, Undecided, UsageError, read_answer, settle, waiting_hint
from sophos_cli.client import Api, ApiError, EventStream
from sophos_cli.printing import ChatPrinter, tool_call_line
from sophos_cli.watch import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    EXIT_WAITING,
    Left,
    err,
    exit_status,
    follow,
    run_to_end,
    watch,
)

#: a line typed at the prompt that resumes the conversation's unfinished run
RESUME_COMMAND = "/resume"
#: a line typed at the prompt that asks again for the decisions a waiting conversation needs
APPROVE_COMMAND = "/approve"


def _message(args: argparse.Namespace) -> str | None:
    """The message argument; ``-`` reads all of standard input."""
    if args.message == "-":
        return _text(sys.stdin.read().rstrip("\n"), "standard input")
    message: str | None = args.message
    return None if message is None else _text(message, "the message")


def _text(text: str, where: str) -> str:
    """``text`` when it is UTF-8 text. Python keeps bytes it could not decode (from the command
    line, or from standard input without a UTF-8 locale) as lone surrogates, which no request
    can carry: refused here with one line (exit 2), not a traceback."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UsageError(f"{where} is not UTF-8 text (at character {exc.start + 1})") from None
    return text


def _regenerate(api: Api, conversation: str) -> dict[str, Any]:
    """Ask for another answer to the conversation's last message; say which calls of the answer
    it leaves may have acted (their effects stay)."""
    messages = api.conversation(conversation).get("messages") or []
    if not messages:
        raise UsageError(f"conversation {conversation} has no message to answer again")
    accepted = api.regenerate(conversation, str(messages[-1]["id"]))
    for call in accepted.get("abandonedCalls") or []:
        err(f"left on the previous branch, may have acted (its effects stay): "
            f"{tool_call_line(call.get('name'), call.get('arguments'))}")
    return accepted


def chat(api: Api, args: argparse.Namespace) -> int:
    if (args.resume or args.regenerate) and not args.conversation:
        err(f"--{'resume' if args.resume else 'regenerate'} needs --conversation")
        return EXIT_USAGE
    if args.regenerate and (args.resume or args.message is not None):
        err("--regenerate takes no message and no --resume: it answers the last message again")
        return EXIT_USAGE
    if args.assistant and args.conversation:
        err("--assistant begins a new conversation: a conversation keeps its own (leave out --conversation)")
        return EXIT_USAGE
    if args.message is None and not args.resume and not args.regenerate:
        return interactive(api, args.conversation, args.assistant)
    if args.regenerate:
        accepted = _regenerate(api, args.conversation)
    else:
        message = None if args.resume else _message(args)
        if not args.resume and not (message or "").strip():
            err("the message is empty")
            return EXIT_USAGE
        accepted = api.chat(message, args.conversation, args.resume, args.assistant)
    conversation, run = accepted["conversation"], accepted["run"]
    print(f"conversation {conversation}  run {run}", file=sys.stderr, flush=True)
    printer = ChatPrinter(sys.stdout)

    def follow_run(run: str) -> str:
        return run_to_end(api, conversation, run, printer)

    try:
        status = follow_run(run)
        if status == "waiting":
            # Asked on a terminal; otherwise the requests and the `sophos approve` command.
            status = settle(api, conversation, follow_run, read_answer if sys.stdin.isatty() else None)
    except Left:
        return EXIT_INTERRUPTED
    except Undecided as exc:
        err(waiting_hint(conversation))
        return EXIT_INTERRUPTED if exc.interrupted else EXIT_WAITING
    return exit_status(status)


def _read_line(prompt: str) -> str | None:
    """The next line typed (None at end of input). A prompt and line editing on a terminal only,
    so a script piping lines in reads nothing but answers."""
    if sys.stdin.isatty():
        try:
            return _text(input(prompt), "the line typed")
        except EOFError:
            print(flush=True)  # Ctrl-D: the shell's prompt starts on a line of its own
            return None
    line = sys.stdin.readline()
    return None if line == "" else _text(line.rstrip("\n"), "standard input")


def interactive(api: Api, conversation: str | None, assistant: str | None = None) -> int:
    """A prompt loop on one conversation (a new one begun with ``assistant``, when given). Ctrl-C
    stops the answer being written (the run is cancelled); Ctrl-C at the prompt or a second Ctrl-C
    leaves (130), end of input leaves (0, or 4 while the conversation waits for a decision). A run
    that waits asks for each decision."""
    if sys.stdin.isatty():
        err(f"type a message; {RESUME_COMMAND} resumes an interrupted run, {APPROVE_COMMAND} asks for the "
            "decisions a waiting one needs; Ctrl-C stops an answer, Ctrl-D leaves")
    printer = ChatPrinter(sys.stdout)
    # Lines piped in answer the questions too: the prompt loop reads its answers from stdin either way.
    read: Reader = read_answer
    waiting = False

    def answer(conversation: str, run: str) -> str:
        """Follow ``run``; Ctrl-C cancels it and follows it to its end, a second Ctrl-C leaves."""
        stream = watch(api, conversation, run)
        try:
            return follow(stream, printer)
        except KeyboardInterrupt:
            printer.finish()
            try:
                return stop(api, stream, run, printer)
            except KeyboardInterrupt:
                printer.finish()
                err(f"left; run {run} may still be stopping")
                raise Left from None

    def still_waits(conversation: str) -> bool:
        """Ask until no run waits; True when left undecided (the conversation still waits)."""
        try:
            settle(api, conversation, lambda run: answer(conversation, run), read)
        except Undecided:
            err(waiting_hint(conversation) + f" (or {APPROVE_COMMAND} here)")
            return True
        except ApiError as exc:
            if exc.status == 401:
                raise
            err(f"{exc.code}: {exc.message}")
            return exc.code != "NO_APPROVAL_PENDING"
        return False

    while True:
        try:
            line = _read_line("you> ")
        except KeyboardInterrupt:
            print(file=sys.stderr)
            return EXIT_INTERRUPTED
        if line is None:
            return EXIT_WAITING if waiting else EXIT_OK
        text = line.strip()
        if not text:
            continue
        if text == APPROVE_COMMAND:
            if conversation is None:
                err("nothing to decide yet: no conversation")
                continue
            try:
                waiting = still_waits(conversation)
            except Left:
                return EXIT_INTERRUPTED
            continue
        resume = text == RESUME_COMMAND
        if resume and conversation is None:
            err("nothing to resume yet: no conversation")
            continue
        try:
            accepted = api.chat(None if resume else line, conversation, resume, assistant)
        except ApiError as exc:
            if exc.status == 401:
                raise  # no token, or the wrong one: every next line would fail the same way
            err(f"{exc.code}: {exc.message}")
            if exc.code == "APPROVAL_PENDING":
                err(f"decide first: {APPROVE_COMMAND}")
            continue
        if conversation is None:
            print(f"conversation {accepted['conversation']}", file=sys.stderr, flush=True)
        conversation, run = accepted["conversation"], accepted["run"]
        try:
            waiting = answer(conversation, run) == "waiting" and still_waits(conversation)
        except Left:
            return EXIT_INTERRUPTED


def stop(api: Api, stream: EventStream, run: str, printer: ChatPrinter) -> str:
    """Cancel ``run`` and follow its stream to the end (what was streamed stays in the conversation)."""
    err("stopping the answer (Ctrl-C again leaves)")
    try:
        api.cancel(run)
    except ApiError as exc:
        if exc.code != "RUN_FINISHED":  # it ended on its own meanwhile: its end follows
            err(f"{exc.code}: {exc.message}")
    return follow(stream, printer)
