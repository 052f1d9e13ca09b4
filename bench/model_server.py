"""The workload's model: ``tests.fakes.ollama.FakeOllama``, in a process of its own.

Replies follow the conversation rather than a fixed script, so the floor and the
service can share one server and concurrent runs cannot take each other's
replies: a request whose last message is a tool result gets the 20-token answer,
any other request gets one call of ``tools__echo`` (``--calls N``: N calls in that one
answer, each its own task; figure 14 uses two). That is the workload's
exchange: user message → tool call → tool result → streamed answer.

Replies start at once unless ``--latency SECONDS`` is given: then every chat
request waits that long before its reply starts, in its own handler thread, so
concurrent requests wait side by side, like a model server with parallel slots.

Run as ``python -m bench.model_server [PORT] [--latency SECONDS] [--calls N]``: prints
``{"url": ...}`` on stdout once it serves, and stops when its stdin closes (the benchmark
went away) or on SIGTERM. The model runs in its own process so it does not share a GIL
with whatever it is serving (the in-process floor runs in the benchmark's process).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from typing import Any

from tests.fakes.ollama import FakeOllama, Reply, Text, ToolCalls

MODEL = "bench-model"
TOOL = "tools__echo"
TOOL_ARGUMENTS = {"text": "durable"}
#: The answer, as exactly 20 streamed pieces.
_WORDS = (  # noqa: SIM905 - a sentence reads better than a list of 20 words
    "The echo tool answered durable so the run went through the queue the worker "
    "and the checkpoint before this answer was streamed back"
).split()
ANSWER_TOKENS: tuple[str, ...] = (*(f"{word} " for word in _WORDS[:19]), "done.")
ANSWER = "".join(ANSWER_TOKENS)
assert len(ANSWER_TOKENS) == 20


class WorkloadOllama(FakeOllama):
    """Answers by the shape of the conversation instead of consuming a script.

    Uses the fake's two private hooks: ``_record`` (called with the request body by
    the handler thread) and ``_next_reply`` (called right after, in the same thread).
    Bodies are not kept: a 100-message conversation would pile them up.
    ``latency``: seconds each chat request waits before its reply starts; ``calls``: tool
    calls in an answer that makes them.
    """

    def __init__(self, port: int = 0, *, latency: float = 0.0, calls: int = 1) -> None:
        super().__init__([MODEL], default_text=ANSWER, port=port)
        self.latency = latency
        self.tool_calls = calls
        self._request = threading.local()
        self.chat_requests = 0

    def _record(self, method: str, path: str, body: dict[str, Any] | None) -> None:
        self._request.body = body
        if body is not None:
            with self._changed:
                self.chat_requests += 1

    def _next_reply(self) -> Reply:
        if self.latency:
            time.sleep(self.latency)  # the handler thread's own: other requests are not held up
        body = getattr(self._request, "body", None) or {}
        messages = body.get("messages") or []
        if messages and messages[-1].get("role") == "tool":
            return Text(ANSWER, tokens=ANSWER_TOKENS)
        return ToolCalls([(TOOL, dict(TOOL_ARGUMENTS)) for _ in range(self.tool_calls)])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.model_server", description=__doc__)
    p.add_argument("port", type=int, nargs="?", default=0, help="port to serve on (default: a free one)")
    p.add_argument("--latency", type=float, default=0.0, help="seconds before each reply starts")
    p.add_argument("--calls", type=int, default=1, help="tool calls in an answer that makes them")
    args = p.parse_args(argv)
    fake = WorkloadOllama(args.port, latency=args.latency, calls=args.calls).start()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())

    def wait_for_eof() -> None:
        sys.stdin.read()
        done.set()

    threading.Thread(target=wait_for_eof, daemon=True).start()
    print(json.dumps({"url": fake.url}), flush=True)
    done.wait()
    fake.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
