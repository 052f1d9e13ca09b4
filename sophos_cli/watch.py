"""Following a run's event stream to its end, and what the client tells on stderr meanwhile."""

from __future__ import annotations

import sys
from typing import Any

from sophos_cli.client import Api, EventStream
from sophos_cli.printing import ChatPrinter

#: exit statuses of every command (docs/cli.md)
EXIT_OK = 0
EXIT_FAILED = 1  # the API refused, or the run did not complete
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_WAITING = 4  # the run paused for an approval: not a failure, `sophos approve` decides
EXIT_INTERRUPTED = 130  # left with Ctrl-C


def err(text: str) -> None:
    print(f"sophos: {text}", file=sys.stderr, flush=True)


def resume_hint(conversation: str) -> str:
    return f"resume it with: sophos chat --resume --conversation {conversation}"


def exit_status(status: str) -> int:
    """A command's exit status for the run status it ended on."""
    if status == "completed":
        return EXIT_OK
    return EXIT_WAITING if status == "waiting" else EXIT_FAILED


def follow(stream: EventStream, printer: ChatPrinter) -> str:
    """Print the run's events until its terminal one; return the run's final status.

    A run that ends ``waiting`` is not told here: its requests are read from the
    conversation (the one place that holds them, whatever was missed) by :mod:`sophos_cli.approve`.
    """
    for event in stream:
        if event.type == "token" and isinstance(event.data, str):
            printer.token(event.data)
        elif event.type == "trace" and isinstance(event.data, dict):
            printer.trace(event.data)
        elif event.type == "missed":
            printer.finish()
            err(f"some events are no longer kept: {event.data}")
        elif event.type == "approval":
            printer.finish()
        elif event.type == "end":
            printer.finish()
            status = str((event.data or {}).get("status", "completed"))
            if status not in ("completed", "waiting"):  # waiting: paused, not failed
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


class Left(Exception):
    """The user left with Ctrl-C; what goes on without them was told."""


def run_to_end(api: Api, conversation: str, run: str, printer: ChatPrinter) -> str:
    """Follow ``run`` to its end; Ctrl-C stops watching only (the run goes on): :class:`Left`."""
    try:
        return follow(watch(api, conversation, run), printer)
    except KeyboardInterrupt:
        printer.finish()
        err(f"stopped watching; run {run} goes on (sophos cancel {run} stops it)")
        raise Left from None


def watch(api: Api, conversation: str, run: str) -> EventStream:
    """The run's event stream, telling on stderr when the connection is lost and back."""
    stream = api.stream(conversation, run)

    def connection(reason: str | None) -> None:
        if reason is None:
            err("reconnected" + (f", resuming after event {stream.last_id}" if stream.last_id else ""))
        else:
            err(f"{reason}; reconnecting")

    stream.on_connection = connection
    return stream
