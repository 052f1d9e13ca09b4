"""Following a run's event stream to its end, and what the client tells on stderr meanwhile."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

from sophos_cli.client import Api, ApiError, EventStream, Unreachable
from sophos_cli.invocation import command
from sophos_cli.printing import ChatPrinter

#: exit statuses of every command (docs/cli.md)
EXIT_OK = 0
EXIT_FAILED = 1  # the API refused, or the run did not complete
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_WAITING = 4  # the run paused for an approval: not a failure, `sophos approve` decides
EXIT_INTERRUPTED = 130  # left with Ctrl-C

#: while a run waits in the queue, how often its place is asked for
QUEUE_POLL_SECONDS = 1.0


def err(text: str) -> None:
    print(f"sophos: {text}", file=sys.stderr, flush=True)


def resume_hint(conversation: str) -> str:
    return f"resume it with: {command('chat', '--resume', '--conversation', conversation)}"


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
    quiet = tell_queue(stream.api, stream.run) if stream.run and stream.last_id is None else lambda: None
    try:
        return _follow(stream, printer, quiet)
    finally:
        quiet()


def tell_queue(api: Api, run: str) -> Callable[[], None]:
    """Until the run leaves the queue, or the function returned is called (its first event came),
    say ``queued (position N)`` on stderr each time its place changes; 1 starts next."""
    done = threading.Event()
    lock = threading.Lock()  # never a "queued" line once the answer has begun

    def poll() -> None:
        told = None
        while not done.is_set():
            try:
                info = api.run(run)
            except (ApiError, Unreachable):
                return  # the stream tells what is wrong
            place = info.get("position")
            if info.get("status") != "queued" or place is None:
                return
            with lock:
                if place != told and not done.is_set():
                    err(f"queued (position {place + 1})")
                    told = place
            done.wait(QUEUE_POLL_SECONDS)

    threading.Thread(target=poll, name="queue", daemon=True).start()

    def stop() -> None:
        with lock:
            done.set()

    return stop


def _follow(stream: EventStream, printer: ChatPrinter, quiet: Callable[[], None]) -> str:
    for event in stream:
        quiet()
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
            if _resumable(stream):
                err(resume_hint(stream.conversation))
            return status
    printer.finish()
    return "completed"  # 204: the terminal event was seen before


def _resumable(stream: EventStream) -> bool:
    """Can a resume finish the failed run (an interruption, the model gone, ...)? The API says."""
    try:
        return bool(stream.api.conversation(stream.conversation).get("resumable"))
    except (ApiError, Unreachable):
        return False


class Left(Exception):
    """The user left with Ctrl-C; what goes on without them was told."""


def run_to_end(api: Api, conversation: str, run: str, printer: ChatPrinter) -> str:
    """Follow ``run`` to its end; Ctrl-C stops watching only (the run goes on): :class:`Left`."""
    try:
        return follow(watch(api, conversation, run), printer)
    except KeyboardInterrupt:
        printer.finish()
        err(f"stopped watching; run {run} goes on ({command('cancel', run)} stops it)")
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
