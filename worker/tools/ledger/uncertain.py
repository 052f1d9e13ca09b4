"""The question put to a person about a tool call that may have run (worker/tools/ledger/__init__.py):
the interrupt's request, the decision about the call in the resume value, and what the model is told
of a call not sent again. :meth:`~worker.tools.ledger.calls.Ledger.run` asks it."""

from __future__ import annotations

from typing import Any

from shared.contracts.codec import decode
from shared.contracts.jobs import Decision
from worker.tools.ledger.records import CallRef

#: the ``kind`` of an approval request: a configured approval, or a call that may have run
APPROVAL_KIND = "approval"
UNCERTAIN_KIND = "uncertain"
#: ``response_metadata`` key of the result of an uncertain call: what was decided, and why
UNCERTAIN_MARK = "sophos_uncertain"


def uncertain_request(ref: CallRef, name: str, arguments: dict[str, Any], attempts: int) -> dict[str, Any]:
    """The interrupt that puts a call that may have run to a person (an ``approval`` request)."""
    return {"requests": [{
        "id": ref.tool_call_id, "name": name, "arguments": arguments, "kind": UNCERTAIN_KIND,
        "attempts": attempts,
    }]}


def decision_for(tool_call_id: str, answer: Any) -> Decision:
    """The decision about this call in a resume value (a list of decisions, as for approvals)."""
    decisions = answer if isinstance(answer, list) else [answer]
    for raw in decisions:
        decision = raw if isinstance(raw, Decision) else decode(Decision, raw)
        if decision.id == tool_call_id:
            return decision
    raise ValueError(f"the decision for tool call {tool_call_id} is missing from {answer!r}")


def uncertain_rejection_text(decision: Decision) -> str:
    """What the model is told of an uncertain call the user chose not to send again."""
    text = (
        "This tool call may or may not have taken effect: it was sent and its answer never came (the "
        "worker stopped, or the tool did not answer in time). The user chose not to repeat it, so it "
        "was not sent again."
    )
    return f"{text} Their message: {decision.message}" if decision.message else text


def unanswered_again_text(why: str) -> str:
    """What the model is told of a call sent again on the user's decision that got no answer again."""
    return (
        f"This tool call may or may not have taken effect: it was sent again on the user's decision and"
        f" again got no answer ({why}). It was not sent a third time; do not call it again unless the"
        " user asks."
    )
