"""What a run's creation body asks for, read and checked before anything is submitted: the
body's fields (``RunCreate``), the ones Sophos does not serve (refused by name), the multitask
strategy, a command's resume, the one user message of the input, and the tool messages a UI sends
for the calls a thread waits on (agent-chat-ui). Pure: no Redis, no store (api/protocol/runs/service.py
acts on it).
"""

from __future__ import annotations

from typing import Any

import msgspec

from api.protocol.stream.translate import GRAPH_ID
from shared.contracts.events import text_of
from shared.contracts.protocol import ASSISTANT_ID
from shared.errors import BadRequest, NotFound

#: ``reject`` (a busy thread is 409), ``interrupt`` (cancel the run holding the thread, then
#: start), ``rollback`` (the same, from where the cancelled run started: api/protocol/runs/forks.py)
#: and ``enqueue`` (wait behind it, in the queue: shared/redis/queue.py), the Agent Server's
#: default and so Sophos's (:func:`strategy_of`)
MULTITASK_STRATEGIES = ("reject", "interrupt", "rollback", "enqueue")
#: the longest ``after_seconds``: a queued job's record is kept a day from its submission
MAX_AFTER_SECONDS = 23 * 3600


class RunCreate(msgspec.Struct):
    """Body of ``POST /threads/{id}/runs`` (and ``/stream``, ``/wait``): every field the SDK sends.

    Those Sophos does not serve yet are refused when set (:func:`refuse_unserved`), never
    silently ignored.
    """

    assistant_id: str
    input: dict[str, Any] | None = None
    command: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    context: dict[str, Any] | None = None
    stream_mode: str | list[str] | None = None
    stream_subgraphs: bool | None = None
    stream_resumable: bool | None = None
    multitask_strategy: str | None = None
    if_not_exists: str | None = None
    on_disconnect: str | None = None
    on_completion: str | None = None
    checkpoint: dict[str, Any] | None = None
    checkpoint_id: str | None = None
    checkpoint_during: bool | None = None
    interrupt_before: str | list[str] | None = None
    interrupt_after: str | list[str] | None = None
    feedback_keys: list[str] | None = None
    webhook: str | None = None
    after_seconds: int | None = None
    durability: str | None = None
    strict_resume: bool | None = None
    langsmith_tracer: dict[str, Any] | None = None


def assistant_of(assistant_id: str) -> str:
    """The assistant's id, for ``agent`` or the assistant's own id; NotFound otherwise."""
    if assistant_id in (GRAPH_ID, ASSISTANT_ID):
        return ASSISTANT_ID
    raise NotFound(f"assistant {assistant_id[:64]!r} not found; the one assistant is {GRAPH_ID!r}")


def _unserved(name: str, detail: str = "") -> BadRequest:
    return BadRequest(f"{name} is not served by Sophos{detail} (docs/agent-protocol.md)")


def refuse_unserved(body: RunCreate, *, streamed: bool = False) -> None:
    """Refuse what Sophos does not do yet, naming it, rather than ignore it."""
    for name in ("feedback_keys", "langsmith_tracer", "on_completion"):
        if getattr(body, name) is not None:
            raise _unserved(name)
    # stream_subgraphs is taken (agent-chat-ui sends it): the agent has no subgraphs, so the
    # stream is the same with it or without it.
    if body.multitask_strategy not in (None, *MULTITASK_STRATEGIES):
        raise BadRequest(f"multitask_strategy must be one of {', '.join(MULTITASK_STRATEGIES)}")
    if body.on_disconnect not in (None, "continue", "cancel"):
        raise BadRequest("on_disconnect must be 'continue' or 'cancel'")
    if body.on_disconnect == "cancel" and not streamed:
        # A wait's client that leaves is not noticed until the answer (uvicorn tells a handler
        # only on its next receive, and the body was read): only a stream notices.
        raise _unserved("on_disconnect 'cancel' without a stream", "; runs.stream serves it")
    if body.durability not in (None, "sync"):
        raise _unserved(f"durability {body.durability!r}", "; every step is checkpointed (sync)")
    if body.if_not_exists not in (None, "reject", "create"):
        raise BadRequest("if_not_exists must be 'reject' or 'create'")
    if body.after_seconds is not None and not 0 <= body.after_seconds <= MAX_AFTER_SECONDS:
        raise BadRequest(f"after_seconds must be 0 to {MAX_AFTER_SECONDS} (a queued job is kept a day)")


def strategy_of(body: RunCreate) -> str:
    """The run's ``multitask_strategy``: the one asked for, else the Agent Server's default,
    ``enqueue``. A fork (``checkpoint_id``) does not wait behind a run: its default is ``reject``."""
    if body.multitask_strategy is not None:
        return body.multitask_strategy
    return "reject" if body.checkpoint_id or body.checkpoint else "enqueue"


def resume_of(body: RunCreate) -> Any:
    """``command.resume``: the decisions that continue a thread waiting for them."""
    command = body.command or {}
    other = sorted(set(command) - {"resume"})
    if "goto" in other:  # agent-chat-ui's "Mark as resolved": goto END over a pending approval
        raise _unserved(
            "command.goto", "; a waiting thread goes on only by its decisions: approve, edit or reject "
            "each pending call, or send a new message, which rejects them"
        )
    if other:
        raise _unserved(f"command.{other[0]} with resume", "; decisions come alone")
    if "resume" not in command:
        raise BadRequest("command must carry resume: {\"resume\": {\"decisions\": [...]}}")
    if body.input:
        raise BadRequest("a run takes input or command.resume, not both")
    return command["resume"]


def answers_of(graph_input: dict[str, Any] | None) -> tuple[dict[str, str], dict[str, Any] | None]:
    """The tool messages that come before a run's new user message (agent-chat-ui adds one for each
    call still without a result when a message is sent over a pending approval), by tool call id,
    and the input without them."""
    messages = (graph_input or {}).get("messages")
    if not isinstance(messages, list) or len(messages) < 2:
        return {}, graph_input
    *tools, last = messages
    if not all(isinstance(m, dict) and (m.get("type") or m.get("role")) == "tool" for m in tools):
        return {}, graph_input
    answers: dict[str, str] = {}
    for message in tools:
        call_id, content = message.get("tool_call_id"), message.get("content")
        if not isinstance(call_id, str) or not call_id:
            raise BadRequest("a tool message in the input must name its tool_call_id")
        if not isinstance(content, str | list):
            raise BadRequest("a tool message's content must be text or a list of text blocks")
        answers[call_id] = text_of(content)
    return answers, {**(graph_input or {}), "messages": [last]}


def unanswered_calls(messages: list[dict[str, Any]]) -> list[str]:
    """The tool calls of a thread's messages that no tool message answers (a run cut while they
    were out), by id: those agent-chat-ui adds a tool message for."""
    answered = {m.get("tool_call_id") for m in messages if m.get("type") == "tool"}
    calls = [c.get("id") for m in messages if m.get("type") == "ai" for c in m.get("tool_calls") or []]
    return [str(c) for c in calls if c and c not in answered]


def message_of(graph_input: dict[str, Any] | None) -> str | None:
    """The new user message of a run's input; None for no input (the run resumes the thread)."""
    if not graph_input or graph_input == {"messages": []}:
        return None
    messages = graph_input.get("messages")
    if set(graph_input) != {"messages"} or not isinstance(messages, list) or len(messages) != 1:
        raise BadRequest('input must be {"messages": [one message]}: a run takes one new user message')
    message = messages[0]
    if isinstance(message, str):
        return message
    if not isinstance(message, dict) or (message.get("role") or message.get("type")) not in ("user", "human"):
        raise BadRequest('the input message must be {"role": "user" (or "human"), "content": ...}')
    content = message.get("content")
    if not isinstance(content, str | list):
        raise BadRequest("the input message's content must be text or a list of text blocks")
    return text_of(content)
