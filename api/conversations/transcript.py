"""A thread's state as the API shows it: messages, Markdown, JSON Lines.

Works on what LangGraph's state API returns (``StateSnapshot``), never on the
checkpoints' stored channel values: since the messages are a DeltaChannel, a
checkpoint stores only what its step added. The functions taking a graph are
meant for :meth:`api.store.Store.read_thread`, which runs them in a reader process.
"""

from __future__ import annotations

import json
import re
from collections.abc import Container, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from msgspec import UNSET

from api.chat.schemas import Branch
from api.conversations.schemas import (
    Approval,
    CheckpointLine,
    ConversationInfo,
    LedgerEntry,
    Message,
    ToolCall,
)
from shared.contracts.events import text_of
from shared.contracts.ledger import DONE
from shared.contracts.runs import APPROVALS_MARK, STOPPED_MARK

# langchain is imported by the functions that run in a reader process (api/store.py): the API's
# main process, which formats Markdown here, never loads it.
if TYPE_CHECKING:
    from langchain_core.messages import AIMessage, BaseMessage

    from shared.storage.threads.history import Read
    from shared.storage.threads.stand_ins import Snapshot as StateSnapshot

_START = "__start__"


def to_message(message: BaseMessage, fallback_id: str) -> Message | None:
    """The API's shape of a thread message; None for kinds never shown (system prompts)."""
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    message_id = message.id or fallback_id
    content = text_of(message.content)
    if isinstance(message, HumanMessage):
        return Message(id=message_id, role="user", content=content)
    if isinstance(message, AIMessage):
        decided = _approvals(message)
        calls = [
            ToolCall(
                id=call.get("id") or "", name=call["name"], arguments=dict(call.get("args") or {}),
                approval=decided.get(call.get("id") or "", UNSET),
            )
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


def _approvals(message: AIMessage) -> dict[str, Approval]:
    """The decisions the worker recorded on ``message`` (``response_metadata["approvals"]``)."""
    record = (message.response_metadata or {}).get(APPROVALS_MARK)
    if not isinstance(record, Mapping):
        return {}
    decided: dict[str, Approval] = {}
    for call_id, entry in record.items():
        if not isinstance(entry, Mapping) or entry.get("action") not in ("approve", "reject", "edit"):
            continue
        proposed, text, by = entry.get("proposed"), entry.get("message"), entry.get("by")
        decided[str(call_id)] = Approval(
            action=entry["action"],
            proposed_arguments=dict(proposed) if isinstance(proposed, Mapping) else UNSET,
            message=text if isinstance(text, str) and text else UNSET,
            decided_by=by if isinstance(by, str) and by else UNSET,
        )
    return decided


def _stopped(message: BaseMessage) -> bool:
    """Written by the worker when a cancel cut the run: an answer or a tool call cut short."""
    return bool((message.response_metadata or {}).get(STOPPED_MARK))


def thread_messages(state: StateSnapshot) -> list[BaseMessage]:
    """The thread's messages at ``state``, with input not yet merged into them.

    A run's input checkpoint holds the new message as the ``__start__`` task's
    write until the first step applies it; a run that stopped right there still
    has the user's message in the thread, and resuming will process it. (The live
    state, ``get_state`` of the thread, already counts it in ``values``; a record
    of the history does not.)
    """
    from langchain_core.messages import BaseMessage

    values: Mapping[str, Any] = state.values if isinstance(state.values, Mapping) else {}
    messages = [m for m in values.get("messages") or [] if isinstance(m, BaseMessage)]
    return messages + pending_input(state, {m.id for m in messages if m.id})


def pending_input(state: StateSnapshot, known: Container[str | None]) -> list[BaseMessage]:
    """The input ``state``'s ``__start__`` task wrote and no step merged yet: its messages whose
    id is not ``known`` (the ids of the state's messages)."""
    from langchain_core.messages import BaseMessage

    messages: list[BaseMessage] = []
    for task in state.tasks:
        written = task.result if task.name == _START and isinstance(task.result, Mapping) else {}
        messages += [
            m for m in written.get("messages") or []
            if isinstance(m, BaseMessage) and (m.id is None or m.id not in known)
        ]
    return messages


def shown(messages: Iterable[BaseMessage]) -> list[Message]:
    out = (to_message(m, str(i)) for i, m in enumerate(messages))
    return [m for m in out if m is not None]


def lines_of(history: Iterable[StateSnapshot]) -> list[CheckpointLine]:
    """The lines of ``history``, a path of checkpoints given newest first (as LangGraph's
    ``get_state_history`` yields them, each the parent of the one before), returned oldest first.

    Each line is made once its parent has been read, and only two states are held at a time:
    a state holds (once rebuilt) nearly the whole message list, so holding every state of a
    long thread, as reversing the history first did, held a list per checkpoint.
    """
    lines: list[CheckpointLine] = []
    child: StateSnapshot | None = None
    child_messages: dict[str, BaseMessage] = {}
    for state in history:
        messages = _messages_by_id(state)
        if child is not None:
            adjacent = _parent_id(child) == str(state.config["configurable"]["checkpoint_id"])
            lines.append(_line(child, child_messages, messages if adjacent else {}))
        child, child_messages = state, messages
    if child is not None:
        lines.append(_line(child, child_messages, {}))
    lines.reverse()
    return lines


def lines_along(path: Iterable[Read]) -> list[CheckpointLine]:
    """The lines :func:`lines_of` makes of the same checkpoints, from a path read oldest first
    (shared/storage/threads/history.py, :func:`~shared.storage.threads.history.path`), in time
    linear in its length: a light read's line is made of what its parent's writes set and the
    input it holds, compared with what its parent held under the same ids; any other read's is
    made as :func:`lines_of` makes it, from its state and its parent's built whole."""
    lines: list[CheckpointLine] = []
    #: the messages of the checkpoint read before, by id: built whole, or (None) its channel's
    #: and ``pending``, the input it held
    before: dict[str, BaseMessage] | None = None
    pending: dict[str, BaseMessage] = {}
    for read in path:
        if read.light and read.channel is not None:
            held = pending_input(read.state, read.channel)
            if all(m.id for m in held):
                added = {str(m.id): m for m in held}
                lines.append(_line(read.state, _changed(read, added, before, pending), {}))
                before, pending = None, added
                continue
        state = read.whole()
        messages = _messages_by_id(state)
        parent: Mapping[str, BaseMessage] = {}
        if read.adjacent:
            parent = before if before is not None else {**(read.before() or {}), **pending}
        lines.append(_line(state, messages, parent))
        before, pending = messages, {}
    return lines


def _changed(
    read: Read, held: Mapping[str, BaseMessage], before: Mapping[str, BaseMessage] | None,
    pending: Mapping[str, BaseMessage],
) -> dict[str, BaseMessage]:
    """What a light read's checkpoint holds that its parent did not, or held otherwise, in the
    order of its messages: ``held``, its input, after its channel's. Only what its parent's
    writes set (``read.written``), its parent's input (``pending``) and its own can differ."""
    channel, written = read.channel or {}, read.written

    def old(key: str) -> BaseMessage | None:
        if before is not None:
            return before.get(key)
        return pending[key] if key in pending else read.previously(key)

    places = {key: i for i, key in enumerate(held)}
    keys = [key for key in dict.fromkeys([*written, *pending, *held]) if key in channel or key in places]
    keys.sort(key=lambda k: (0, read.position[k]) if k in channel else (1, places[k]))
    changed: dict[str, BaseMessage] = {}
    for key in keys:
        new = channel[key] if key in channel else held[key]
        if (was := old(key)) is None or (was is not new and was != new):
            changed[key] = new
    return changed


def _parent_id(state: StateSnapshot) -> str | None:
    parent = state.parent_config["configurable"].get("checkpoint_id") if state.parent_config else None
    return str(parent) if parent else None


def _messages_by_id(state: StateSnapshot) -> dict[str, BaseMessage]:
    return {m.id or str(i): m for i, m in enumerate(thread_messages(state))}


def _line(
    state: StateSnapshot, messages: Mapping[str, BaseMessage], before: Mapping[str, BaseMessage]
) -> CheckpointLine:
    """The line of ``state``: what it added to ``before``, its parent's messages."""
    checkpoint_id = str(state.config["configurable"]["checkpoint_id"])
    parent_id = _parent_id(state)
    # Only what the checkpoint added or replaced is converted: a long thread's every
    # checkpoint holds (once rebuilt) nearly the whole list. A message replaced under
    # its id (an answer whose tool calls were decided) counts as added; rebuilt from the
    # same decoded writes, an unchanged message is the same object, so the check is cheap.
    added = (
        to_message(m, message_id) for message_id, m in messages.items()
        if (old := before.get(message_id)) is None or (old is not m and old != m)
    )
    metadata: Mapping[str, Any] = state.metadata or {}
    step = metadata.get("step")
    return CheckpointLine(
        checkpoint_id=checkpoint_id,
        parent_checkpoint_id=parent_id,
        step=step if isinstance(step, int) else None,
        source=metadata.get("source"),
        run_id=metadata.get("run_id"),
        created_at=state.created_at,
        next=sorted(state.next),
        messages=[m for m in added if m is not None],
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


def _decision(approval: Approval) -> str:
    # Here, not at the top: shared.users brings shared.settings_parsing, which a reader process has
    # no other use for (bench figure 16); a transcript with no decision never needs it.
    from shared.users import LOCAL_USER

    reason = f": {approval.message}" if approval.message else ""
    # Named once identities are on; the one user of a service without them stays "the user".
    who = approval.decided_by if approval.decided_by and approval.decided_by != LOCAL_USER else "the user"
    if approval.action == "reject":
        return f"*Rejected by {who}{reason}* (not run)."
    if approval.action == "edit":
        proposed = json.dumps(approval.proposed_arguments or {}, ensure_ascii=False)
        return f"*Edited by {who} before it ran*; the model proposed {_code(proposed)}."
    return f"*Approved by {who}.*"


def _forked(branch: Branch) -> str:
    """Where the thread forks: the branch shown among the others, and what acted on each."""
    others = [(i, a) for i, a in enumerate(branch.alternatives, 1) if i != branch.index]
    text = (
        f"*Branch {branch.index} of {branch.count}: the thread forks before this message (edited or "
        "answered again). The other branches are kept; they start with: "
        + "; ".join(f"{i}. {_code(a.content[:80])}" for i, a in others) + ".*"
    )
    for i, alternative in others:
        for call in alternative.acting_calls:
            text += f"\n\n*Branch {i} called {_code(call.name)} (id {_code(call.id)}): its effects stay.*"
    return text


def _sent(ledger: LedgerEntry) -> str:
    times = "once" if ledger.attempts == 1 else f"{ledger.attempts} times"
    told = "its outcome recorded" if ledger.state == DONE else "no outcome recorded: it may have run"
    return f"*Sent {times} (idempotency key {_code(ledger.key)}), {told}.*"


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
    messages = list(messages)
    last_assistant = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=None)
    for index, message in enumerate(messages):
        lines += ["", "---", ""]
        if message.role == "user":
            lines += ["## User", "", message.content]
            if message.branch:
                lines += ["", _forked(message.branch)]
        elif message.role == "assistant":
            lines.append("## Assistant" + (" (stopped)" if message.status == "stopped" else ""))
            if message.content:
                lines += ["", message.content]
            for call in message.tool_calls or []:
                arguments = json.dumps(call.arguments, indent=2, ensure_ascii=False)
                lines += ["", f"**Tool call** {_code(call.name)} (id {_code(call.id)}):", "",
                          _fence(arguments, "json")]
                if call.ledger:
                    lines += ["", _sent(call.ledger)]
                if call.approval:
                    lines += ["", _decision(call.approval)]
                elif conversation.status == "waiting" and index == last_assistant:
                    lines += ["", "*Waiting for the user's decision on this turn's calls.*"]
        else:
            name = _code(message.name) if message.name else "tool"
            for_call = f" for call {_code(message.tool_call_id)}" if message.tool_call_id else ""
            failed = {"error": " (error)", "stopped": " (stopped)"}.get(str(message.status), "")
            lines += [f"## Tool result: {name}{for_call}{failed}", "", _fence(message.content, "text")]
    return "\n".join(lines) + "\n"
