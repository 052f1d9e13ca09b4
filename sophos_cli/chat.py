"""``sophos chat``: one message (or standard input), a resume, or a conversation at a prompt."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sophos_cli.client import Api, ApiError, EventStream
from sophos_cli.printing import ChatPrinter, short

#: a line typed at the prompt that resumes the conversation's unfinished run
RESUME_COMMAND = "/resume"


def err(text: str) -> None:
    print(f"sophos: {text}", file=sys.stderr, flush=True)


def resume_hint(conversation: str) -> str:
    return f"resume it with: sophos chat --resume --conversation {conversation}"


def approval_hint(conversation: str) -> str:
    return (f"waiting for a decision on each call: POST /api/chat with conversation {conversation} "
            "and decisions (README: Approvals)")


def follow(stream: EventStream, printer: ChatPrinter) -> str:
    """Print the run's events until its terminal one; return the run's final status."""
    for event in stream:
        if event.type == "token" and isinstance(event.data, str):
            printer.token(event.data)
        elif event.type == "trace" and isinstance(event.data, dict):
            printer.trace(event.data)
        elif event.type == "missed":
            printer.finish()
            err(f"some events are no longer kept: {event.data}")
        elif event.type == "approval" and isinstance(event.data, dict):
            printer.finish()
            for request in event.data.get("requests") or []:
                err(f"approval needed: {request.get('name')}({short(request.get('arguments') or {})}) "
                    f"id {request.get('id')}")
        elif event.type == "end":
            printer.finish()
            status = str((event.data or {}).get("status", "completed"))
            if status == "waiting":  # paused, not failed: a decision per call starts the next run
                err(approval_hint(stream.conversation))
            elif status != "completed":
                err(f"the run was {status}")
            return status
        elif event.type == "chat-error":
            printer.finish()
            data: dict[str, Any] = event.data if isinstance(event.data, dict) else {}
            status = str(data.get("status", "failed"))
            err(f"the run {status}: {data.get('code')}: {data.get('message')}")
            if status == "interrupted" or data.get("code") == "INTERRUPTED":
                err(resume_hint(stream.conversation))
            return status
    printer.finish()
    return "completed"  # 204: the terminal event was seen before


def _watch(api: Api, conversation: str, run: str) -> EventStream:
    stream = api.stream(conversation, run)

    def connection(reason: str | None) -> None:
        if reason is None:
            err("reconnected" + (f", resuming after event {stream.last_id}" if stream.last_id else ""))
        else:
            err(f"{reason}; reconnecting")

    stream.on_connection = connection
    return stream


def _message(args: argparse.Namespace) -> str | None:
    """The message argument; ``-`` reads all of standard input."""
    if args.message == "-":
        return sys.stdin.read().rstrip("\n")
    message: str | None = args.message
    return message


def chat(api: Api, args: argparse.Namespace) -> int:
    if args.resume and not args.conversation:
        err("--resume needs --conversation")
        return 2
    if args.message is None and not args.resume:
        return interactive(api, args.conversation)
    message = None if args.resume else _message(args)
    if not args.resume and not (message or "").strip():
        err("the message is empty")
        return 2
    accepted = api.chat(message, args.conversation, args.resume)
    conversation, run = accepted["conversation"], accepted["run"]
    print(f"conversation {conversation}  run {run}", file=sys.stderr, flush=True)
    printer = ChatPrinter(sys.stdout)
    try:
        status = follow(_watch(api, conversation, run), printer)
    except KeyboardInterrupt:
        printer.finish()
        err(f"stopped watching; run {run} goes on (sophos cancel {run} stops it)")
        return 130
    return 0 if status == "completed" else 1


def _read_line(prompt: str) -> str | None:
    """The next line typed (None at end of input). A prompt and line editing on a terminal only,
    so a script piping lines in reads nothing but answers."""
    if sys.stdin.isatty():
        try:
            return input(prompt)
        except EOFError:
            return None
    line = sys.stdin.readline()
    return None if line == "" else line.rstrip("\n")


def interactive(api: Api, conversation: str | None) -> int:
    """A prompt loop on one conversation. Ctrl-C stops the answer being written (the run is
    cancelled); Ctrl-C at the prompt, a second Ctrl-C, or end of input leaves."""
    if sys.stdin.isatty():
        err(f"type a message; {RESUME_COMMAND} resumes an interrupted run; Ctrl-C stops an answer, "
            "Ctrl-D leaves")
    printer = ChatPrinter(sys.stdout)
    while True:
        try:
            line = _read_line("you> ")
        except KeyboardInterrupt:
            print(file=sys.stderr)
            return 0
        if line is None:
            return 0
        text = line.strip()
        if not text:
            continue
        resume = text == RESUME_COMMAND
        if resume and conversation is None:
            err("nothing to resume yet: no conversation")
            continue
        try:
            accepted = api.chat(None if resume else line, conversation, resume)
        except ApiError as exc:
            if exc.status == 401:
                raise  # no token, or the wrong one: every next line would fail the same way
            err(f"{exc.code}: {exc.message}")
            continue
        if conversation is None:
            print(f"conversation {accepted['conversation']}", file=sys.stderr, flush=True)
        conversation, run = accepted["conversation"], accepted["run"]
        stream = _watch(api, conversation, run)
        try:
            follow(stream, printer)
        except KeyboardInterrupt:
            printer.finish()
            try:
                stop(api, stream, run, printer)
            except KeyboardInterrupt:
                printer.finish()
                err(f"left; run {run} may still be stopping")
                return 130


def stop(api: Api, stream: EventStream, run: str, printer: ChatPrinter) -> None:
    """Cancel ``run`` and follow its stream to the end (what was streamed stays in the conversation)."""
    err("stopping the answer (Ctrl-C again leaves)")
    try:
        api.cancel(run)
    except ApiError as exc:
        if exc.code != "RUN_FINISHED":  # it ended on its own meanwhile: its end follows
            err(f"{exc.code}: {exc.message}")
    follow(stream, printer)
