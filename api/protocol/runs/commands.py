"""What a client may write into a thread besides a message: ``update_state``'s ``values`` and a
run's ``command`` (``goto``, ``update``), checked. Pure.

The agent's state is its messages, so ``values`` and ``command.update`` are ``{"messages": [...]}``;
``goto`` names the node to run next, ``agent`` (the model's turn): ``tools`` runs one task per
tool call the answer asked for, which only the model's answer makes.
"""

from __future__ import annotations

from typing import Any, Final

from shared.contracts.runs import AGENT, TOOLS
from shared.errors import BadRequest

#: the nodes an update may be written as (the approval node only ever asks)
AS_NODES: Final = (AGENT, TOOLS)
#: the nodes a command may go to
GOTO_NODES: Final = (AGENT,)
#: the roles (or LangChain types) a written message may have
ROLES: Final = ("user", "human", "assistant", "ai", "system", "tool")
#: at most this many messages in one update
MAX_MESSAGES: Final = 100


def values_of(values: Any, name: str = "values") -> dict[str, Any]:
    """``values`` checked: ``{"messages": [message, ...]}``, the agent's one channel."""
    if not isinstance(values, dict) or set(values) != {"messages"}:
        raise BadRequest(f'{name} must be {{"messages": [...]}}: the state of the agent is its messages')
    messages = values["messages"]
    if not isinstance(messages, list) or not 1 <= len(messages) <= MAX_MESSAGES:
        raise BadRequest(f"{name}.messages must be a list of 1 to {MAX_MESSAGES} messages")
    for n, message in enumerate(messages):
        where = f"{name}.messages[{n}]"
        if not isinstance(message, dict):
            raise BadRequest(f"{where} must be a message (role, content)")
        role = message.get("role") or message.get("type")
        if role not in ROLES:
            raise BadRequest(f"{where}: role must be one of {', '.join(ROLES)}")
        if not isinstance(message.get("content"), str | list):
            raise BadRequest(f"{where}: content must be text or a list of blocks")
        if "id" in message and not isinstance(message["id"], str):
            raise BadRequest(f"{where}: id must be a string (a stored message's: replaced)")
        if role == "tool" and not isinstance(message.get("tool_call_id"), str):
            raise BadRequest(f"{where}: a tool message needs its tool_call_id")
    return {"messages": messages}


def as_node_of(as_node: str | None) -> str | None:
    if as_node is not None and as_node not in AS_NODES:
        raise BadRequest(f"as_node must be one of {', '.join(AS_NODES)}")
    return as_node


def command_of(command: dict[str, Any], graph_input: Any) -> dict[str, Any]:
    """A run's ``command`` without ``resume``, checked: ``{"goto", "update"}``."""
    other = sorted(set(command) - {"goto", "update"})
    if other:
        raise BadRequest(
            f"command.{other[0]} is not served by Sophos; a command carries resume, goto or update"
        )
    if graph_input:
        raise BadRequest("a run takes input or a command, not both")
    goto, update = command.get("goto"), command.get("update")
    if goto is None and update is None:
        raise BadRequest("command must carry resume, goto or update")
    if isinstance(goto, list) and len(goto) == 1:
        goto = goto[0]
    if goto is not None and goto not in GOTO_NODES:
        # agent-chat-ui's "Mark as resolved" sends goto END over a pending approval.
        raise BadRequest(
            f"command.goto is not served by Sophos to {str(goto)[:40]!r}, only to "
            f"{' or '.join(repr(n) for n in GOTO_NODES)} (a model's turn): the tools run only the calls "
            "a model's answer asks for, and a waiting thread goes on only by its decisions: approve, "
            "edit or reject each pending call, or send a new message, which rejects them"
        )
    return {"goto": goto, "update": values_of(update, "command.update") if update is not None else None}


def breakpoints_of(before: str | list[str] | None, after: str | list[str] | None) -> dict[str, Any] | None:
    """``interrupt_before`` and ``interrupt_after``, checked: ``"*"`` or nodes of the agent; None
    for neither."""
    stops: dict[str, Any] = {}
    for name, nodes in (("before", before), ("after", after)):
        if nodes is None or nodes == []:
            continue
        if nodes == "*":
            stops[name] = "*"
            continue
        listed = [nodes] if isinstance(nodes, str) else nodes
        if not isinstance(listed, list) or any(n not in AS_NODES for n in listed):
            raise BadRequest(f"interrupt_{name} must be '*' or nodes of the agent: {', '.join(AS_NODES)}")
        stops[name] = list(dict.fromkeys(listed))
    return stops or None
