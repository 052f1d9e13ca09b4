"""A thread's checkpoints as the API shows them: messages, Markdown, JSON Lines.

Works on the checkpoint data read through the checkpointer; never on the tables.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.base import Checkpoint, CheckpointTuple
from msgspec import UNSET

from api.schemas import CheckpointLine, ConversationInfo, Message, ToolCall
from shared.contracts import STOPPED_MARK, text_of

_START = "__start__"
_BRANCH = "branch:to:"


def to_message(message: BaseMessage, fallback_id: str) -> Message | None:
    """The API's shape of a thread message; None for kinds never shown (system prompts)."""
    message_id = message.id or fallback_id
    content = text_of(message.content)
    if isinstance(message, HumanMessage):
        return Message(id=message_id, role="user", content=content)
    if isinstance(message, AIMessage):
        calls = [
            ToolCall(id=call.get("id") or "", name=call["name"], arguments=dict(call.get("args") or {}))
            for call in message.tool_calls
        ]
        return Message(
            id=message_id, role="assistant", content=content, tool_calls=calls or UNSET,
            status="stopped" if _stopped(message) else UNSET,
        )
    if isinstance(message, ToolMessage):
        return Message(
            id=message_id, role="tool", content=content,
            name=message.name if message.name is not None else UNSET,
            tool_call_id=message.tool_call_id, status="stopped" if _stopped(message) else message.status,
        )
    return None


def _stopped(message: BaseMessage) -> bool:
    """Written by the worker when a cancel cut the run: an answer or a tool call cut short."""
    return bool((message.response_metadata or {}).get(STOPPED_MARK))


def thread_messages(checkpoint: Checkpoint) -> list[BaseMessage]:
    """The thread's messages at ``checkpoint``, with input not yet merged into them.

    A run's input checkpoint holds the new message in the ``__start__`` channel until
    the first step applies it; a run that stopped right there still has the user's
    message in the thread, and resuming will process it.
    """
    values: Mapping[str, Any] = checkpoint.get("channel_values") or {}
    messages = [m for m in values.get("messages") or [] if isinstance(m, BaseMessage)]
    pending = values.get(_START)
    if isinstance(pending, Mapping):
        known = {m.id for m in messages if m.id}
        messages += [
            m for m in pending.get("messages") or []
            if isinstance(m, BaseMessage) and (m.id is None or m.id not in known)
        ]
    return messages


def messages_of(checkpoint: Checkpoint | None) -> list[Message]:
    if checkpoint is None:
        return []
    shown = (to_message(m, str(i)) for i, m in enumerate(thread_messages(checkpoint)))
    return [m for m in shown if m is not None]


def next_nodes(checkpoint: Checkpoint) -> list[str]:
    """Nodes triggered by ``checkpoint``: a trigger channel still holding a value that
    the node has not yet seen (how LangGraph decides the next tasks of a graph whose
    edges are all ``branch:to:<node>`` channels, as ours are)."""
    values: Mapping[str, Any] = checkpoint.get("channel_values") or {}
    versions: Mapping[str, Any] = checkpoint.get("channel_versions") or {}
    seen: Mapping[str, Mapping[str, Any]] = checkpoint.get("versions_seen") or {}
    due = []
    for channel in values:
        if channel == _START:
            node = _START
        elif channel.startswith(_BRANCH):
            node = channel.removeprefix(_BRANCH)
        else:
            continue
        version, last_seen = versions.get(channel), seen.get(node, {}).get(channel)
        if version is not None and (last_seen is None or _later(version, last_seen)):
            due.append(node)
    return sorted(due)


def _later(a: Any, b: Any) -> bool:
    try:
        return bool(a > b)
    except TypeError:
        return str(a) > str(b)


def checkpoint_lines(history: Iterable[CheckpointTuple]) -> Iterator[CheckpointLine]:
    """One line per checkpoint (oldest first) with the messages it added to its parent."""
    seen_ids: dict[str, set[str]] = {}
    for item in history:
        checkpoint_id = str(item.config["configurable"]["checkpoint_id"])
        parent_id = item.parent_config["configurable"].get("checkpoint_id") if item.parent_config else None
        before = seen_ids.get(str(parent_id), set()) if parent_id else set()
        messages = messages_of(item.checkpoint)
        seen_ids[checkpoint_id] = {m.id for m in messages}
        metadata: Mapping[str, Any] = item.metadata or {}
        step = metadata.get("step")
        yield CheckpointLine(
            checkpoint_id=checkpoint_id,
            parent_checkpoint_id=str(parent_id) if parent_id else None,
            step=step if isinstance(step, int) else None,
            source=metadata.get("source"),
            run_id=metadata.get("run_id"),
            created_at=item.checkpoint.get("ts"),
            next=next_nodes(item.checkpoint),
            messages=[m for m in messages if m.id not in before],
        )


# --- Markdown -------------------------------------------------------------------

_BACKTICKS = re.compile(r"`+")


def _fence(text: str, info: str = "") -> str:
    longest = max((len(run) for run in _BACKTICKS.findall(text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{info}\n{text}\n{fence}"


def _code(text: str) -> str:
    longest = max((len(run) for run in _BACKTICKS.findall(text)), default=0)
    ticks = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def markdown(conversation: ConversationInfo, messages: Iterable[Message]) -> str:
    """A readable transcript: the conversation's messages, tool calls and results."""
    lines = [
        f"# {conversation.title or 'Conversation'}",
        "",
        f"- Conversation: {conversation.id}",
        f"- Created: {conversation.created_at}",
        f"- Updated: {conversation.updated_at}",
        f"- Status: {conversation.status}" + (" (resumable)" if conversation.resumable else ""),
    ]
    if conversation.error:
        lines.append(f"- Error: {conversation.error.code}: {conversation.error.message}")
    for message in messages:
        lines += ["", "---", ""]
        if message.role == "user":
            lines += ["## User", "", message.content]
        elif message.role == "assistant":
            lines.append("## Assistant" + (" (stopped)" if message.status == "stopped" else ""))
            if message.content:
                lines += ["", message.content]
            for call in message.tool_calls or []:
                arguments = json.dumps(call.arguments, indent=2, ensure_ascii=False)
                lines += ["", f"**Tool call** {_code(call.name)} (id {_code(call.id)}):", "",
                          _fence(arguments, "json")]
        else:
            name = _code(message.name) if message.name else "tool"
            for_call = f" for call {_code(message.tool_call_id)}" if message.tool_call_id else ""
            failed = {"error": " (error)", "stopped": " (stopped)"}.get(str(message.status), "")
            lines += [f"## Tool result: {name}{for_call}{failed}", "", _fence(message.content, "text")]
    return "\n".join(lines) + "\n"
