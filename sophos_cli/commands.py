"""Argument parsing and what each command prints."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from sophos_cli.client import Api, ApiError, Unreachable

DEFAULT_URL = "http://127.0.0.1:8000"
#: longest tool result printed (the full one is in the conversation)
RESULT_CHARS = 300


def _duration(ms: int | float | None) -> str:
    if ms is None:
        return "-"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


def _short(value: Any, limit: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- chat -----------------------------------------------------------------------------


class ChatPrinter:
    """Tokens as they come; a tool call or result on a line of its own."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.mid_line = False

    def _line(self, text: str) -> None:
        if self.mid_line:
            self.out.write("\n")
        self.out.write(text + "\n")
        self.out.flush()
        self.mid_line = False

    def token(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()
        self.mid_line = not text.endswith("\n")

    def trace(self, data: dict[str, Any]) -> None:
        body = data.get("data") or {}
        if data.get("event") == "call":
            self._line(f"[tool] {body.get('name')}({_short(body.get('arguments', {}), RESULT_CHARS)})")
        elif data.get("event") == "result":
            status = " (error)" if body.get("status") == "error" else ""
            self._line(f"[tool] {body.get('name')} ->{status} {_short(body.get('result', ''), RESULT_CHARS)}")

    def finish(self) -> None:
        if self.mid_line:
            self.out.write("\n")
            self.out.flush()
        self.mid_line = False


def chat(api: Api, args: argparse.Namespace) -> int:
    if args.resume and not args.conversation:
        print("sophos: --resume needs --conversation", file=sys.stderr)
        return 2
    if not args.resume and not args.message:
        print("sophos: a message is needed (or --resume --conversation ID)", file=sys.stderr)
        return 2
    accepted = api.chat(args.message, args.conversation, args.resume)
    conversation, run = accepted["conversation"], accepted["run"]
    print(f"conversation {conversation}  run {run}", file=sys.stderr)
    printer = ChatPrinter(sys.stdout)
    try:
        for event in api.events(conversation):
            if event.type == "token" and isinstance(event.data, str):
                printer.token(event.data)
            elif event.type == "trace" and isinstance(event.data, dict):
                printer.trace(event.data)
            elif event.type == "missed":
                printer.finish()
                print(f"sophos: some events are no longer kept: {event.data}", file=sys.stderr)
            elif event.type == "end":
                printer.finish()
                status = (event.data or {}).get("status", "completed")
                if status != "completed":
                    print(f"sophos: the run was {status}", file=sys.stderr)
                return 0 if status == "completed" else 1
            elif event.type == "chat-error":
                printer.finish()
                data = event.data or {}
                print(f"sophos: the run {data.get('status', 'failed')}: {data.get('code')}: "
                      f"{data.get('message')}", file=sys.stderr)
                if data.get("status") == "interrupted":
                    print(f"sophos: resume it with: sophos chat --resume --conversation {conversation}",
                          file=sys.stderr)
                return 1
    except KeyboardInterrupt:
        printer.finish()
        print(f"sophos: stopped watching; run {run} goes on (sophos cancel {run} stops it)", file=sys.stderr)
        return 130
    printer.finish()
    return 0


# --- runs -----------------------------------------------------------------------------


def _table(rows: list[list[str]], out: TextIO) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        out.write("  ".join(cells).rstrip() + "\n")


def _worker_line(worker: dict[str, Any] | None) -> str:
    if worker is None:
        return "worker: unknown (Redis unavailable)"
    if worker.get("alive"):
        return (f"worker: alive, pid {worker.get('pid', '?')}, since {worker.get('startedAt', '?')}, "
                f"last beat {_duration(worker.get('heartbeatAgeMs'))} ago")
    if "lastBeatAt" in worker:
        return f"worker: NOT ALIVE, last heartbeat {_duration(worker.get('heartbeatAgeMs'))} ago"
    return "worker: NOT ALIVE (none has ever started)"


def _where(run: dict[str, Any]) -> str:
    if run["status"] == "queued":
        return f"#{run.get('position', '?')}"
    if run["status"] == "running":
        return str(run.get("node", "-")) + (" (cancelling)" if run.get("cancelRequested") else "")
    error = run.get("error")
    return f"{error['code']}" if error else "-"


def runs(api: Api, args: argparse.Namespace) -> int:
    if args.status:
        listing = api.runs(status=args.status, conversation=args.conversation, limit=args.limit)
        found = listing["runs"]
    else:
        running = api.runs(status="running", conversation=args.conversation, limit=args.limit)
        queued = api.runs(status="queued", conversation=args.conversation, limit=args.limit)
        found = running["runs"] + sorted(queued["runs"], key=lambda r: r.get("position", 0))
        listing = queued
    print(_worker_line(listing.get("worker")))
    if not found:
        print("no runs" if args.status else "no queued or running runs")
        return 0
    rows = [["STATUS", "RUN", "CONVERSATION", "POS/NODE/ERROR", "STEPS", "WAITED", "TIME"]]
    for run in found:
        time_ms = run.get("elapsedMs") if run["status"] == "running" else run.get("durationMs")
        rows.append([
            run["status"], run["id"], run["conversation"], _where(run), str(run.get("stepCount", 0)),
            _duration(run.get("waitedMs")), _duration(time_ms),
        ])
    _table(rows, sys.stdout)
    return 0


def cancel(api: Api, args: argparse.Namespace) -> int:
    run = api.cancel(args.run)
    if run["status"] == "cancelled":
        print(f"run {run['id']} cancelled")
    else:
        print(f"run {run['id']} is {run['status']}: the worker is stopping it")
    return 0


# --- entry point ------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=argparse.SUPPRESS, help=f"the API (default {DEFAULT_URL})")
    common.add_argument("--token", default=argparse.SUPPRESS, help="bearer token (default: $SOPHOS_TOKEN)")
    main = argparse.ArgumentParser(prog="sophos", description="Talk to a Sophos API.", parents=[common])
    commands = main.add_subparsers(dest="command", required=True)

    p = commands.add_parser("chat", parents=[common], help="send a message, print the answer as it streams")
    p.add_argument("message", nargs="?", help="the message (not with --resume)")
    p.add_argument("--conversation", "-c", help="continue this conversation (default: a new one)")
    p.add_argument("--resume", action="store_true", help="resume the conversation's unfinished run")
    p.set_defaults(handler=chat)

    p = commands.add_parser("runs", parents=[common], help="print the queued and running runs")
    statuses = ["queued", "running", "completed", "failed", "interrupted", "cancelled"]
    p.add_argument("--status", choices=statuses, help="list runs of this status instead")
    p.add_argument("--conversation", "-c", help="only this conversation's runs")
    p.add_argument("--limit", type=int, default=100)
    p.set_defaults(handler=runs)

    p = commands.add_parser("cancel", parents=[common], help="cancel a queued or running run")
    p.add_argument("run", help="the run's id")
    p.set_defaults(handler=cancel)
    return main


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    url = getattr(args, "url", None) or os.environ.get("SOPHOS_URL") or DEFAULT_URL
    token = getattr(args, "token", None) or os.environ.get("SOPHOS_TOKEN") or None
    api = Api(url, token)
    try:
        result: int = args.handler(api, args)
        return result
    except ApiError as exc:
        print(f"sophos: {exc.code}: {exc.message}", file=sys.stderr)
        return 1
    except Unreachable as exc:
        print(f"sophos: {exc}", file=sys.stderr)
        return 3
    finally:
        api.close()
