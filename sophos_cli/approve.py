"""Deciding on tool calls that wait for an approval: ``sophos approve``, and ``sophos chat``'s questions.

The requests are read from the conversation (``pendingApproval``), never only from a
stream: a client that missed the ``approval`` event, or comes back a day later, sees the
same ones. Every id named on the command line is checked against them before anything is
posted; the API checks again (exactly one decision per request) and stays the authority.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sophos_cli.client import Api
from sophos_cli.invocation import command
from sophos_cli.printing import ChatPrinter, short
from sophos_cli.watch import (
    EXIT_INTERRUPTED,
    EXIT_WAITING,
    Left,
    err,
    exit_status,
    run_to_end,
)

#: reads one answer: the question, then the line typed (None at end of input)
Reader = Callable[[str], str | None]
#: follows a run, given its id, to its end; returns its final status
Follower = Callable[[str], str]


class UsageError(Exception):
    """The command line asks for something that cannot be done: nothing was posted (exit 2)."""


class Undecided(Exception):
    """The questions were left (end of input, or Ctrl-C): no decision was posted."""

    def __init__(self, interrupted: bool) -> None:
        super().__init__("no decision")
        self.interrupted = interrupted


def approve_command(conversation: str) -> str:
    return command("approve", conversation)


def waiting_hint(conversation: str) -> str:
    return f"no decision sent; the conversation still waits. Decide with: {approve_command(conversation)}"


def request_line(request: dict[str, Any]) -> str:
    call = f"{request.get('name')}({short(request.get('arguments') or {})})"
    if request.get("kind") == "uncertain":
        # A call the worker was making when it stopped: approving sends it again.
        return (f"this call may already have run: {call} id {request.get('id')}"
                " (approve sends it again with the same key; reject never sends it)")
    return f"approval needed: {call} id {request.get('id')}"


def parse_arguments(text: str) -> dict[str, Any]:
    """A call's new arguments: a JSON object, or ValueError saying what is wrong with ``text``."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not valid JSON ({exc}): {short(text, 80)}") from None
    if not isinstance(value, dict):
        raise ValueError(f'the arguments must be a JSON object, like {{"url": "https://example.org"}}; '
                         f"got {type(value).__name__ if value is not None else 'null'}")
    return value


def read_answer(prompt: str) -> str | None:
    """The next line of standard input. On a terminal, line editing (the question on stdout
    along with it); otherwise the question on stderr, so the answer stream stays clean."""
    if sys.stdin.isatty() and sys.stdout.isatty():
        try:
            return input(prompt)
        except EOFError:
            print(flush=True)  # Ctrl-D: what follows starts on a line of its own
            return None
    sys.stderr.write(prompt)
    sys.stderr.flush()
    if sys.stdin.isatty():
        try:
            return input()
        except EOFError:
            return None
    line = sys.stdin.readline()
    return None if line == "" else line.rstrip("\n")


def _answer(read: Reader, prompt: str) -> str:
    line = read(prompt)
    if line is None:
        raise Undecided(interrupted=False)
    return line.strip()


def ask(request: dict[str, Any], read: Reader) -> dict[str, Any]:
    """One decision on ``request``, asked until it is a valid one."""
    err(request_line(request))
    call_id = str(request["id"])
    while True:
        choice = _answer(read, "  approve, reject or edit? [a/r/e] ").lower()
        if choice in ("a", "approve"):
            return {"id": call_id, "action": "approve"}
        if choice in ("r", "reject"):
            reason = _answer(read, "  reason, told to the model (empty: none): ")
            return {"id": call_id, "action": "reject", **({"message": reason} if reason else {})}
        if choice in ("e", "edit"):
            err(f"  arguments now: {json.dumps(request.get('arguments') or {}, ensure_ascii=False)}")
            while True:
                text = _answer(read, "  new arguments as JSON (empty: back): ")
                if not text:
                    break
                try:
                    return {"id": call_id, "action": "edit", "arguments": parse_arguments(text)}
                except ValueError as exc:
                    err(f"  {exc}; try again")
            continue
        err("  answer a (approve), r (reject) or e (edit)")


def ask_all(requests: list[dict[str, Any]], read: Reader) -> list[dict[str, Any]]:
    try:
        return [ask(request, read) for request in requests]
    except KeyboardInterrupt:
        print(file=sys.stderr)
        raise Undecided(interrupted=True) from None


@dataclass
class Plan:
    """Decisions given on the command line, by id; ``rest`` decides every request not named."""

    named: dict[str, dict[str, Any]] = field(default_factory=dict)
    rest: dict[str, Any] | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Plan | None:
        """None when no decision was given. UsageError for a bad one, before anything is read."""
        plan = cls()
        reason: str | None = args.message
        if reason is not None and not (args.reject or args.reject_all):
            raise UsageError("--message is the reason of a rejection: it goes with --reject or --reject-all")

        def add(call_id: str, decision: dict[str, Any], flag: str) -> None:
            if not call_id:
                raise UsageError(f"{flag} needs a call id")
            if call_id in plan.named:
                raise UsageError(f"call {call_id} is decided twice on the command line")
            plan.named[call_id] = {"id": call_id, **decision}

        for call_id in args.approve:
            add(call_id, {"action": "approve"}, "--approve")
        for given in args.reject:
            call_id, has_own, own = given.partition("=")
            message = own if has_own else reason
            add(call_id, {"action": "reject", **({"message": message} if message else {})}, "--reject")
        for call_id, text in args.edit:
            try:
                arguments = parse_arguments(text)
            except ValueError as exc:
                raise UsageError(f"--edit {call_id}: {exc}") from None
            add(call_id, {"action": "edit", "arguments": arguments}, "--edit")
        if args.approve_all:
            plan.rest = {"action": "approve"}
        elif args.reject_all:
            plan.rest = {"action": "reject", **({"message": reason} if reason else {})}
        return plan if plan.named or plan.rest else None

    def decisions(self, requests: list[dict[str, Any]], read: Reader | None) -> list[dict[str, Any]]:
        """One decision per request, in their order: named, else ``rest``, else asked."""
        pending = [str(r["id"]) for r in requests]
        unknown = [i for i in self.named if i not in pending]
        if unknown:
            listing = "; ".join(f"{r['id']} {r.get('name')}" for r in requests)
            raise UsageError(f"not pending: {', '.join(unknown)}. The pending calls: {listing}")
        decided: list[dict[str, Any]] = []
        for request in requests:
            call_id = str(request["id"])
            if call_id in self.named:
                decided.append(self.named[call_id])
            elif self.rest is not None:
                decided.append({"id": call_id, **self.rest})
            elif read is not None:
                decided.append(ask_all([request], read)[0])
            else:
                undecided = [r for r in requests if str(r["id"]) not in self.named]
                raise UsageError(
                    "no decision for: " + "; ".join(f"{r['id']} {r.get('name')}" for r in undecided)
                    + ". Name each (--approve, --reject, --edit) or add --approve-all / --reject-all"
                )
        return decided


def pending(api: Api, conversation: str) -> list[dict[str, Any]]:
    """The conversation's pending requests. When nothing waits, the API's own refusal is raised
    (409 NO_APPROVAL_PENDING): a decision that can match no call is posted to hear it, so the
    client never words the API's state for it, and nothing can be acted on."""
    requests = api.conversation(conversation).get("pendingApproval")
    if requests:
        return [dict(r) for r in requests]
    api.decide(conversation, [{"id": "-", "action": "reject"}])  # raises ApiError: 409, or 400 (a race)
    raise UsageError(f"conversation {conversation} shows no pending approval")  # pragma: no cover


def _told(decision: dict[str, Any], requests: list[dict[str, Any]]) -> str:
    name = next((r.get("name") for r in requests if str(r["id"]) == decision["id"]), "?")
    action = decision["action"]
    if action == "edit":
        return f"edit {name}({short(decision['arguments'])}) id {decision['id']}"
    reason = f": {decision['message']}" if decision.get("message") else ""
    return f"{action} {name} id {decision['id']}{reason}"


def settle(api: Api, conversation: str, follow_run: Follower, read: Reader | None,
           plan: Plan | None = None) -> str:
    """Decide the conversation's pending calls, post the decisions and follow the next run;
    again while runs wait. ``plan`` decides the first round (what it leaves is asked, when
    ``read`` can ask). Without ``read`` and ``plan``, the requests and the command that decides
    them are printed. Returns the status of the last run ("waiting" when left undecided)."""
    while True:
        requests = pending(api, conversation)
        if plan is not None:
            decisions = plan.decisions(requests, read)
            plan = None
        elif read is not None:
            decisions = ask_all(requests, read)
        else:
            for request in requests:
                err(request_line(request))
            err(f"the run waits for a decision on each call; decide with: {approve_command(conversation)}")
            return "waiting"
        accepted = api.decide(conversation, decisions)
        for decision in decisions:
            err(f"decided: {_told(decision, requests)}")
        print(f"conversation {conversation}  run {accepted['run']}", file=sys.stderr, flush=True)
        status = follow_run(accepted["run"])
        if status != "waiting":
            return status


def approve(api: Api, args: argparse.Namespace) -> int:
    """``sophos approve CONVERSATION [decisions]``: see the parser's description."""
    plan = Plan.from_args(args)
    read: Reader | None = read_answer if sys.stdin.isatty() else None
    if plan is None and read is None:
        for request in pending(api, args.conversation):  # nothing pending: the API's 409 instead
            err(request_line(request))
        raise UsageError(
            "no decision given, and standard input is not a terminal to ask on: pass --approve ID, "
            "--reject ID[=REASON], --edit ID JSON, --approve-all or --reject-all "
            f"({command('approve', '--help')})"
        )
    printer = ChatPrinter(sys.stdout)
    try:
        status = settle(api, args.conversation, lambda run: run_to_end(api, args.conversation, run, printer),
                        read, plan)
    except Undecided as exc:
        err(waiting_hint(args.conversation))
        return EXIT_INTERRUPTED if exc.interrupted else EXIT_WAITING
    except Left:
        return EXIT_INTERRUPTED
    return exit_status(status)
