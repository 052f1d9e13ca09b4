"""Argument parsing, the commands other than chat, and how errors are told."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from sophos_cli import invocation
from sophos_cli.approve import UsageError, approve, approve_command, request_line
from sophos_cli.chat import chat
from sophos_cli.client import Api, ApiError, Unreachable
from sophos_cli.printing import duration, short, table, tool_call_line, tool_result_line
from sophos_cli.prune import prune
from sophos_cli.watch import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_UNREACHABLE, EXIT_USAGE, resume_hint

DEFAULT_URL = "http://127.0.0.1:8000"
#: where the token comes from, first found wins (after --token)
TOKEN_VARIABLES = ("SOPHOS_TOKEN", "API_TOKEN")


# --- runs, cancel ---------------------------------------------------------------------


def _worker_line(worker: dict[str, Any] | None) -> str:
    if worker is None:
        return "worker: unknown (Redis unavailable)"
    if worker.get("alive"):
        at_once = f", {worker['concurrency']} runs at once" if worker.get("concurrency", 1) > 1 else ""
        return (f"worker: alive, pid {worker.get('pid', '?')}, since {worker.get('startedAt', '?')}, "
                f"last beat {duration(worker.get('heartbeatAgeMs'))} ago{at_once}")
    if "lastBeatAt" in worker:
        return f"worker: NOT ALIVE, last heartbeat {duration(worker.get('heartbeatAgeMs'))} ago"
    return "worker: NOT ALIVE (none has ever started)"


def _where(run: dict[str, Any]) -> str:
    if run["status"] == "queued":
        # The API's position counts the runs ahead (0: next); people count from 1, as chat's
        # "queued (position N)" and the web page do.
        position = run.get("position")
        return f"#{position + 1}" if isinstance(position, int) else "#?"
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
            duration(run.get("waitedMs")), duration(time_ms),
        ])
    table(rows, sys.stdout)
    return 0


def cancel(api: Api, args: argparse.Namespace) -> int:
    run = api.cancel(args.run)
    if run["status"] == "cancelled":
        print(f"run {run['id']} cancelled")
    else:
        print(f"run {run['id']} is {run['status']}: the worker is stopping it")
    return 0


# --- conversations ----------------------------------------------------------------------


def conversations(api: Api, args: argparse.Namespace) -> int:
    """One page (``--limit``, ``--cursor``), or every page with ``--all``."""
    found: list[dict[str, Any]] = []
    cursor: str | None = args.cursor
    while True:
        page = api.conversations(limit=args.limit, cursor=cursor)
        found.extend(page.get("conversations") or [])
        cursor = page.get("nextCursor") or None  # an API without paging sends none
        if not (args.all and cursor):
            break
    if args.json:
        print(json.dumps({"conversations": found, **({"nextCursor": cursor} if cursor else {})}, indent=2))
        return 0
    if not found:
        print("no conversations")
    else:
        rows = [["CONVERSATION", "STATUS", "MESSAGES", "UPDATED", "TITLE"]]
        for c in found:
            status = str(c.get("status", "-"))
            if c.get("error"):
                status += f" ({c['error'].get('code')})"
            rows.append([str(c["id"]), status, str(c.get("messageCount", 0)), str(c.get("updatedAt", "-")),
                         short(c.get("title", ""), 60)])
        table(rows, sys.stdout)
    if cursor:
        more = invocation.command("conversations", "--limit", str(args.limit), "--cursor", cursor)
        print(f"more: {more}", file=sys.stderr)
    return 0


def _message_lines(message: dict[str, Any]) -> list[str]:
    role, content = message.get("role"), str(message.get("content") or "")
    if role == "tool":
        return [tool_result_line(message.get("name"), content, message.get("status") == "error")]
    lines = [f"{'you' if role == 'user' else 'assistant'}: {content}"] if content or role == "user" else []
    if lines and (branch := message.get("branch")):  # the thread forks before it (an edit, a regenerate)
        lines[0] += f"  [branch {branch.get('index')}/{branch.get('count')}]"
    for call in message.get("toolCalls") or []:
        lines.append(tool_call_line(call.get("name"), call.get("arguments")))
    return lines


def show(api: Api, args: argparse.Namespace) -> int:
    detail = api.conversation(args.conversation)
    if args.json:
        print(json.dumps(detail, indent=2, ensure_ascii=False))
        return 0
    info = detail["conversation"]
    print(f"conversation {info['id']}: {info.get('title', '')}")
    status = str(info.get("status", "-"))
    error = info.get("error")
    if error:
        status += f" ({error.get('code')}: {error.get('message')})"
    print(f"status {status}, {info.get('messageCount', 0)} messages, created {info.get('createdAt')}, "
          f"updated {info.get('updatedAt')}")
    if detail.get("resumable"):
        print(f"unfinished: {resume_hint(info['id'])}")
        for line in plan_lines(detail.get("resumePlan") or []):
            print(line)
    for request in detail.get("pendingApproval") or []:
        print(request_line(request))
    if detail.get("pendingApproval"):
        print(f"decide with: {approve_command(info['id'])}")
    print()
    for message in detail.get("messages") or []:
        for line in _message_lines(message):
            print(line)
    return 0


#: what ``sophos show`` says a resume will do with a call (``resumePlan`` in the detail)
PLAN_WORDS = {
    "answer": "answered from the ledger (it finished; not sent again)",
    "send": "sent (it was never sent)",
    "resend": "sent again with its key (it may have run; safe to repeat)",
    "task": "answered from its task on the tool's server (asked about only if the server forgot it)",
    "ask": "asked about first (it may already have run)",
}


def plan_lines(plan: list[dict[str, Any]]) -> list[str]:
    """A line per call of the turn a resume continues: what the resume will do with it."""
    lines = []
    for planned in plan:
        action = str(planned.get("action"))
        call = f"{planned.get('name')} id {planned.get('id')}"
        lines.append(f"  on resume {call}: {PLAN_WORDS.get(action, action)}")
    return lines


def export(api: Api, args: argparse.Namespace) -> int:
    body = api.export(args.conversation, args.jsonl)
    if args.output and args.output != "-":
        with open(args.output, "wb") as f:
            f.write(body)
        print(f"wrote {len(body)} bytes to {args.output}", file=sys.stderr)
    else:
        sys.stdout.buffer.write(body)
        sys.stdout.flush()
    return 0


def rename(api: Api, args: argparse.Namespace) -> int:
    status, body = api.rename(args.conversation, args.title)
    if status == 202:
        print(f"conversation {args.conversation}: renaming to {body['title']!r} accepted; "
              "the worker writes it when it takes the job")
    else:
        print(f"conversation {args.conversation} renamed to {body['title']!r}")
    return 0


def delete(api: Api, args: argparse.Namespace) -> int:
    status = api.delete(args.conversation)
    if status == 202:
        print(f"conversation {args.conversation}: deletion accepted; "
              "the worker deletes it when it takes the job")
    else:
        print(f"conversation {args.conversation} deleted")
    return 0


def whoami(api: Api, args: argparse.Namespace) -> int:
    who = api.whoami()
    role = "an operator" if who["operator"] else "a user"
    print(f"{who['name']} ({role}; by {who['via']})")
    return 0


# --- entry point ------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=argparse.SUPPRESS,
                        help=f"the API (default: $SOPHOS_URL, else {DEFAULT_URL})")
    common.add_argument("--token", default=argparse.SUPPRESS,
                        help="bearer token (default: $SOPHOS_TOKEN, else $API_TOKEN)")
    main = argparse.ArgumentParser(
        prog="sophos", description="Talk to a Sophos API. `sophos COMMAND --help` tells more.",
        epilog="Installed with the package, `sophos worker` and `sophos api` also start the service's "
               "two processes (python -m worker, python -m api).",
        parents=[common],
    )
    commands = main.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, summary: str, description: str | None = None) -> argparse.ArgumentParser:
        return commands.add_parser(name, parents=[common], help=summary, description=description or summary)

    p = command("chat", "send a message and print the answer as it streams; no message: a prompt", (
        "Send MESSAGE (`-`: read it from standard input) and print the answer as it streams, tool "
        "calls included. Without MESSAGE: a prompt loop on one conversation, one message per line "
        "(lines piped in work too); Ctrl-C stops the answer being written (the run is cancelled), "
        "Ctrl-C at the prompt or end of input leaves; a line `/resume` resumes an interrupted run."))
    p.add_argument("message", nargs="?", help="the message; `-` reads standard input")
    p.add_argument("--conversation", "-c", help="continue this conversation (default: a new one)")
    p.add_argument("--resume", action="store_true", help="resume the conversation's unfinished run")
    p.add_argument("--assistant", "-a",
                   help="begin the new conversation with this assistant (its id; default: agent, config/'s)")
    p.add_argument(
        "--regenerate", action="store_true",
        help="answer the conversation's last message again; the answer it had stays on another branch",
    )
    p.epilog = ("A run that waits for an approval asks approve / reject / edit for each call when standard "
                "input is a terminal (and at the prompt); otherwise it prints the calls and the `sophos "
                "approve CONVERSATION` command that decides them, and exits 4.")
    p.set_defaults(handler=chat)

    p = command("approve", "decide on the tool calls a conversation waits for, then follow the answer", (
        "Decide on each tool call the conversation waits for (approve, reject, or edit its arguments), "
        "post the decisions and print the answer as it streams; when that run waits again, ask again. "
        "Without decision flags, each call is asked on the terminal. With flags, every call not named "
        "is asked on a terminal and refused otherwise (exit 2, nothing posted); the flags decide the "
        "first round only. An id that is not pending is refused before anything is posted. "
        "Exit 0 when the answer completed, 4 when it waits for a decision again and no terminal can "
        "ask, 1 when refused (409 NO_APPROVAL_PENDING: nothing waits) or the run did not complete."))
    p.add_argument("conversation", help="the conversation's id")
    p.add_argument("--approve", action="append", default=[], metavar="ID",
                   help="run this call as proposed; repeatable")
    p.add_argument("--reject", action="append", default=[], metavar="ID[=REASON]",
                   help="never run this call; the model is told so, with REASON (else --message); repeatable")
    p.add_argument("--edit", action="append", default=[], nargs=2, metavar=("ID", "JSON"),
                   help="run this call with these arguments instead, a JSON object; repeatable")
    every = p.add_mutually_exclusive_group()
    every.add_argument("--approve-all", action="store_true", help="approve every call not named")
    every.add_argument("--reject-all", action="store_true", help="reject every call not named")
    p.add_argument("--message", "-m", metavar="TEXT",
                   help="the reason told to the model, for --reject-all and each --reject ID without its own")
    p.set_defaults(handler=approve)

    p = command("conversations", "list conversations, newest first, a page at a time")
    p.add_argument("--limit", type=int, default=20, help="conversations per page (default 20)")
    p.add_argument("--cursor", help="the page after this one (printed under the previous page)")
    p.add_argument("--all", action="store_true", help="follow every page to the end")
    p.add_argument("--json", action="store_true", help="print the API's JSON")
    p.set_defaults(handler=conversations)

    p = command("show", "print a conversation: its status and every message")
    p.add_argument("conversation", help="the conversation's id")
    p.add_argument("--json", action="store_true", help="print the API's JSON")
    p.set_defaults(handler=show)

    p = command("export", "print a conversation's Markdown transcript (or its checkpoints as JSON Lines)")
    p.add_argument("conversation", help="the conversation's id")
    p.add_argument("--jsonl", action="store_true", help="one JSON line per checkpoint, oldest first")
    p.add_argument("--output", "-o", help="write to this file instead of standard output")
    p.set_defaults(handler=export)

    p = command("rename", "give a conversation another title")
    p.add_argument("conversation", help="the conversation's id")
    p.add_argument("title", help="its new title (at most 200 characters)")
    p.set_defaults(handler=rename)

    p = command("delete", "delete a conversation (refused while one of its runs is queued or running)")
    p.add_argument("conversation", help="the conversation's id")
    p.set_defaults(handler=delete)

    p = command("runs", "print the queued and running runs, and the worker's pulse")
    statuses = ["queued", "running", "completed", "failed", "interrupted", "cancelled", "waiting"]
    p.add_argument("--status", choices=statuses, help="list runs of this status instead")
    p.add_argument("--conversation", "-c", help="only this conversation's runs")
    p.add_argument("--limit", type=int, default=100)
    p.set_defaults(handler=runs)

    p = command("whoami", "print who the API takes this client for (its token's user)")
    p.set_defaults(handler=whoami)

    p = command("prune", "prune the checkpoints no conversation needs any more (operators)", (
        "Ask the worker to prune old checkpoints: each conversation keeps its branches' latest "
        "checkpoints and what they are read from; the older steps go (docs/operating.md, \"Pruning "
        "checkpoints\"). Conversations with a run queued, running or waiting are skipped. Waits "
        "for the worker to finish and prints what it did, unless --no-wait."))
    p.add_argument("--no-wait", action="store_true", help="print the job's id and return at once")
    p.add_argument("--timeout", type=float, default=3600.0,
                   help="seconds to wait for the prune to finish (default 3600)")
    p.set_defaults(handler=prune)

    p = command("cancel", "cancel a queued or running run")
    p.add_argument("run", help="the run's id")
    p.set_defaults(handler=cancel)
    return main


def token_of(args: argparse.Namespace, env: Mapping[str, str]) -> tuple[str | None, str | None]:
    """The token and where it came from (``--token`` or a variable's name)."""
    if getattr(args, "token", None):
        return args.token, "--token"
    for name in TOKEN_VARIABLES:
        if env.get(name):
            return env[name], name
    return None, None


def unauthorized(exc: ApiError, source: str | None) -> str:
    if source is None:
        return (f"{exc.code}: {exc.message}. The API wants a token: set SOPHOS_TOKEN to your key "
                "(`sophos users add NAME` makes one) or the API's API_TOKEN, or pass --token")
    return (f"{exc.code}: {exc.message}. The token from {source} was refused: "
            f"it must be a key in force, a valid token of the API's identity provider, or its API_TOKEN")


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    url = getattr(args, "url", None) or os.environ.get("SOPHOS_URL") or DEFAULT_URL
    token, source = token_of(args, os.environ)
    invocation.use(invocation.Invocation(
        program=invocation.program_of(sys.argv[0], getattr(sys, "orig_argv", []), os.environ,
                                      invocation.which_sophos()),
        options=invocation.options_of(getattr(args, "url", None), getattr(args, "token", None)),
    ))
    api = Api(url, token)
    try:
        result: int = args.handler(api, args)
        return result
    except ApiError as exc:
        message = unauthorized(exc, source) if exc.status == 401 else f"{exc.code}: {exc.message}"
        print(f"sophos: {message}", file=sys.stderr)
        return EXIT_FAILED
    except UsageError as exc:
        print(f"sophos: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Unreachable as exc:
        print(f"sophos: {exc}\nsophos: is the API running (`./sophos up`)? --url or SOPHOS_URL names another",
              file=sys.stderr)
        return EXIT_UNREACHABLE
    except UnicodeDecodeError as exc:
        # Standard input that is not UTF-8 text (`chat -`, or a line at the prompt).
        print(f"sophos: standard input is not UTF-8 text ({exc.reason} at byte {exc.start})", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    finally:
        api.close()
