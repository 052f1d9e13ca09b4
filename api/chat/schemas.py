"""Request and response bodies of chat: a message, a resume, a decision, a branch switch.

JSON field names are camelCase except in the JSON Lines export, whose lines keep
the checkpointer's own snake_case names. Optional fields are left out, not null.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType


class DecisionBody(msgspec.Struct, forbid_unknown_fields=True):
    """One decision on a pending tool call; ``arguments`` replaces the call's for ``edit``."""

    id: str
    action: Literal["approve", "reject", "edit"]
    arguments: dict[str, Any] | None = None
    #: for ``reject``: told to the model with the rejection
    message: str | None = None


class ChatRequest(msgspec.Struct):
    """Body of ``POST /api/chat``: a new message, ``resume: true`` with a conversation, or decisions.

    Permissive on purpose: wrong types are rejected by validation, the rest is
    checked by hand in the order the contract gives.
    """

    message: str | None = None
    conversation: str | None = None
    resume: bool = False
    #: with a conversation waiting for an approval: one decision per pending request
    decisions: list[DecisionBody] | None = None
    #: with ``message``: the id of an earlier user message this one replaces (an edit)
    replaces: str | None = None
    #: the id of an answer (or of the user message it answers) to answer again
    regenerate: str | None = None
    #: with a new conversation: the assistant it is with (an id, or ``agent``, the default;
    #: docs/agent-protocol.md "Assistants"); its next runs keep it
    assistant: str | None = None


class ActingCall(msgspec.Struct, kw_only=True):
    """A tool call that may have acted on the world (its tool is not known to be safe to repeat:
    read-only or idempotent) and was sent: left on a branch, its effects stay."""

    id: str
    name: str
    arguments: dict[str, Any]


class ChatAccepted(msgspec.Struct, rename="camel", omit_defaults=True):
    conversation: str
    run: str
    #: an edit or a regenerate: the calls of the branch it leaves that may have acted
    abandoned_calls: list[ActingCall] | UnsetType = UNSET


class BranchRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Body of ``POST /api/conversations/{id}/branch``: the first message of the branch to follow
    (an id from a message's ``branch.alternatives``)."""

    message: str


class Alternative(msgspec.Struct, rename="camel", kw_only=True):
    """One branch from a fork point: the message it starts with, and the tool calls made on it
    that may have acted on the world (their effects stay whichever branch is followed)."""

    message: str
    content: str
    acting_calls: list[ActingCall]


class Branch(msgspec.Struct, rename="camel", kw_only=True):
    """On the first message after a fork point: which of its branches the conversation follows
    (``index``, from 1) out of ``count``; switch with ``POST /api/conversations/{id}/branch``
    ``{message: alternatives[i].message}``."""

    index: int
    count: int
    alternatives: list[Alternative]
