"""Sophos's approvals in langchain's ``HumanInTheLoopMiddleware`` shapes, which agent-chat-ui renders.

Pure: no I/O. A thread waiting for a decision has one or more pending interrupts whose value is
Sophos's own ``{"requests": [{id, name, arguments, kind, attempts?}]}`` (worker/agent/graph.py for the
configured approvals, worker/tools/ledger/ for calls that may already have run). The protocol shows
each as :func:`hitl_value`::

    {"action_requests": [{"name", "args", "description"}],
     "review_configs": [{"action_name", "allowed_decisions": ["approve", "edit", "reject"]}]}

and takes the answer as ``command: {"resume": {"decisions": [...]}}``, one decision per request
in the order shown (across the pending interrupts, in the state's order), or as a map of
interrupt id to ``{"decisions": [...]}``.

An interrupt of one request also carries LangGraph's earlier ``HumanInterrupt`` fields
(``action_request: {action, args}``, ``config: {allow_*}``, ``description``), which the published
agent-chat-ui release (``create-agent-chat-app`` 0.1.6) and Agent Inbox render, and the answer may
be their ``HumanResponse`` list: ``[{"type": "accept" | "edit" | "response", "args"}]``.
:func:`decisions_of` turns any of these into Sophos's decisions
(:class:`~api.http.schemas.DecisionBody`, keyed by tool call id), which go through the
native decision path (``ChatService.submit``): the same checks, acted on once.
"""

from __future__ import annotations

import json
from typing import Any, Final

from api.chat.schemas import DecisionBody
from shared.errors import BadRequest

ALLOWED_DECISIONS: Final = ("approve", "edit", "reject")
#: the ``HumanInterrupt`` config: ``ignore`` would end the turn with the call unanswered, which no
#: decision of Sophos does
INBOX_CONFIG: Final = {"allow_ignore": False, "allow_respond": True, "allow_edit": True, "allow_accept": True}
INBOX_RESPONSES: Final = ("accept", "edit", "response")
#: how a call that may already have run is described (the tool-effects rules: asked, never repeated silently)
UNCERTAIN_NOTE: Final = "This call may already have run"

Pending = list[tuple[str, list[dict[str, Any]]]]


def _description(request: dict[str, Any]) -> str:
    name, args = request.get("name"), json.dumps(request.get("arguments") or {}, ensure_ascii=False)
    if request.get("kind") == "uncertain":
        attempts = request.get("attempts") or 1
        return (
            f"{UNCERTAIN_NOTE}: it was sent {attempts} time(s) and its outcome was not recorded "
            "before the run stopped. Approve sends it again (with the same idempotency key), edit "
            "sends new arguments, reject does not send it.\n\n"
            f"Tool: {name}\nArgs: {args}"
        )
    return f"Tool execution requires approval\n\nTool: {name}\nArgs: {args}"


def hitl_value(value: Any) -> Any:
    """An interrupt's value as the protocol shows it: Sophos's requests in the middleware's shape
    (any other value as it is)."""
    if not isinstance(value, dict) or not isinstance(value.get("requests"), list):
        return value
    requests = [r for r in value["requests"] if isinstance(r, dict)]
    names = list(dict.fromkeys(str(r.get("name")) for r in requests))
    inbox: dict[str, Any] = {}
    if len(requests) == 1:  # HumanInterrupt holds one action; several show in the new shape only
        [request] = requests
        inbox = {
            "action_request": {"action": request.get("name"), "args": request.get("arguments") or {}},
            "config": dict(INBOX_CONFIG),
            "description": _description(request),
        }
    return {
        **inbox,
        "action_requests": [
            {"name": r.get("name"), "args": r.get("arguments") or {}, "description": _description(r)}
            for r in requests
        ],
        "review_configs": [
            {"action_name": name, "allowed_decisions": list(ALLOWED_DECISIONS)} for name in names
        ],
    }


def interrupts_of(pending: Pending) -> list[dict[str, Any]]:
    """The SDK's ``Interrupt`` for each pending interrupt.

    ``pending``: shared.storage.threads.state.pending_interrupts."""
    return [{"value": hitl_value({"requests": requests}), "id": i} for i, requests in pending]


def _decision(given: Any, request: dict[str, Any], n: int) -> DecisionBody:
    call_id, name = str(request["id"]), str(request.get("name"))
    if not isinstance(given, dict):
        raise BadRequest(f"decision {n} must be an object with a type")
    kind = given.get("type")
    if kind == "approve":
        return DecisionBody(id=call_id, action="approve")
    if kind == "reject":
        message = given.get("message")
        if message is not None and not isinstance(message, str):
            raise BadRequest(f"decision {n}: a reject's message must be text")
        return DecisionBody(id=call_id, action="reject", message=message)
    if kind == "edit":
        action = given.get("edited_action")
        args = action.get("args") if isinstance(action, dict) else None
        if not isinstance(args, dict):
            raise BadRequest(f"decision {n}: an edit needs edited_action {{name, args}} with args an object")
        if action.get("name") not in (None, name):  # type: ignore[union-attr]
            raise BadRequest(f"decision {n}: an edit keeps the tool ({name}); edited_action.name differs")
        return DecisionBody(id=call_id, action="edit", arguments=args)
    raise BadRequest(f"decision {n}: type must be one of {', '.join(ALLOWED_DECISIONS)}, got {kind!r}")


def _response(given: Any, request: dict[str, Any], n: int) -> DecisionBody:
    """One ``HumanResponse`` as Sophos's decision: accept approves, edit edits, a response rejects
    with its text (the tool is not run; the model is told the text)."""
    call_id, name = str(request["id"]), str(request.get("name"))
    kind = given.get("type") if isinstance(given, dict) else None
    args = given.get("args") if isinstance(given, dict) else None
    if kind == "accept":
        return DecisionBody(id=call_id, action="approve")
    if kind == "response":
        if not isinstance(args, str):
            raise BadRequest(f"response {n}: a response's args must be text")
        return DecisionBody(id=call_id, action="reject", message=args)
    if kind == "edit":
        edited = args.get("args") if isinstance(args, dict) else None
        if not isinstance(edited, dict):
            raise BadRequest(f"response {n}: an edit needs args {{action, args}} with args an object")
        if args.get("action") not in (None, name):  # type: ignore[union-attr]
            raise BadRequest(f"response {n}: an edit keeps the tool ({name}); args.action differs")
        return DecisionBody(id=call_id, action="edit", arguments=edited)
    raise BadRequest(f"response {n}: type must be one of {', '.join(INBOX_RESPONSES)}, got {kind!r}")


def _listed(value: Any, where: str) -> list[Any]:
    decisions = value.get("decisions") if isinstance(value, dict) else None
    if not isinstance(decisions, list):
        raise BadRequest(f'{where} must be {{"decisions": [...]}}, one decision per action request')
    return decisions


def decisions_of(resume: Any, pending: Pending) -> list[DecisionBody]:
    """Sophos's decisions for ``command.resume``: ``{"decisions": [...]}`` in the order of every
    pending request, or ``{interrupt_id: {"decisions": [...]}}`` covering every pending interrupt,
    or a ``HumanResponse`` list, one per pending request."""
    requests = [r for _, rs in pending for r in rs]
    if isinstance(resume, list):
        if len(resume) != len(requests):
            raise BadRequest(
                f"command.resume has {len(resume)} response(s) for {len(requests)} action request(s); "
                'give one per request, or answer with {"decisions": [...]}'
            )
        return [_response(r, q, n) for n, (r, q) in enumerate(zip(resume, requests, strict=True))]
    ids = [i for i, _ in pending]
    if isinstance(resume, dict) and resume and set(resume) <= set(ids):
        missing = [i for i in ids if i not in resume]
        if missing:
            raise BadRequest(f"command.resume has no decisions for interrupt(s) {', '.join(missing)}")
        given = [d for i in ids for d in _listed(resume[i], f"command.resume[{i!r}]")]
    else:
        given = _listed(resume, "command.resume")
    if len(given) != len(requests):
        raise BadRequest(
            f"command.resume has {len(given)} decision(s) for {len(requests)} action request(s); "
            "give one per request, in their order"
        )
    return [_decision(d, r, n) for n, (d, r) in enumerate(zip(given, requests, strict=True))]
