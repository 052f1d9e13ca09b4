"""A run's ending, from its thread (worker/run/outcome/ending.py), and the events that end a stream."""

from __future__ import annotations

import msgspec
import pytest
from langgraph.types import Interrupt, PregelTask, StateSnapshot

from shared.contracts.events import Approval, ChatError, End, EventType, body, event_type, terminal_event
from shared.contracts.runs import RunErrorCode, RunStatus
from worker.run.outcome.ending import APPROVAL_PENDING, Outcome, Thread, settle, thread_of

REQUESTS = [{"id": "call-1", "name": "tools__add", "arguments": {"a": 1}, "kind": "approval"}]
WAITING = Thread(message_count=2, pending=True, requests=REQUESTS)
RESUMABLE = Thread(message_count=3, pending=True)
FINISHED = Thread(message_count=4, pending=False)
UNKNOWN = Thread()

CAUSES = [
    Outcome(RunStatus.COMPLETED),
    Outcome(RunStatus.CANCELLED),
    Outcome(RunStatus.INTERRUPTED, RunErrorCode.INTERRUPTED, "the worker stopped"),
    Outcome(RunStatus.FAILED, RunErrorCode.DATABASE_UNAVAILABLE, "locked"),
]


@pytest.mark.parametrize("cause", CAUSES, ids=lambda c: c.status.value)
def test_a_pending_interrupt_means_waiting_whatever_ended_the_run(cause: Outcome) -> None:
    assert settle(cause, WAITING) == Outcome(RunStatus.WAITING, requests=REQUESTS)


@pytest.mark.parametrize("thread", [RESUMABLE, FINISHED, UNKNOWN], ids=["resumable", "finished", "unknown"])
@pytest.mark.parametrize("cause", CAUSES, ids=lambda c: c.status.value)
def test_without_an_interrupt_the_cause_decides(cause: Outcome, thread: Thread) -> None:
    assert settle(cause, thread) == cause


def test_a_message_refused_over_an_interrupt_waits_and_says_why() -> None:
    refused = Outcome(RunStatus.FAILED, APPROVAL_PENDING, "send the decisions first")
    assert settle(refused, WAITING) == Outcome(
        RunStatus.WAITING, APPROVAL_PENDING, "send the decisions first", REQUESTS
    )


def _snapshot(*tasks: PregelTask, messages: int = 2) -> StateSnapshot:
    return StateSnapshot(
        values={"messages": list(range(messages))}, next=tuple(t.name for t in tasks), config={},
        metadata=None, created_at=None, parent_config=None, tasks=tasks, interrupts=(),
    )


def test_the_thread_is_read_from_its_state_snapshot() -> None:
    interrupt = Interrupt(value={"requests": REQUESTS}, id="i1")
    approval = PregelTask("t1", "approval", (), interrupts=(interrupt,))
    assert thread_of(_snapshot(approval)) == WAITING
    # Written before requests had a kind: an approval.
    kindless = [{k: v for k, v in r.items() if k != "kind"} for r in REQUESTS]
    older = PregelTask("t1", "approval", (), interrupts=(Interrupt(value={"requests": kindless}, id="i1"),))
    assert thread_of(_snapshot(older)).requests == REQUESTS
    # A call that may have run, raised by its own task; decided with the approval's.
    uncertain = {"id": "call-2", "name": "tools__send", "arguments": {}, "kind": "uncertain", "attempts": 1}
    tools = PregelTask("t4", "tools", (), interrupts=(Interrupt(value={"requests": [uncertain]}, id="i3"),))
    both = thread_of(_snapshot(approval, tools))
    assert both.requests == [*interrupt.value["requests"], uncertain]
    assert thread_of(_snapshot(PregelTask("t2", "tools", ()), messages=3)) == RESUMABLE
    assert thread_of(_snapshot(messages=4)) == FINISHED
    # An interrupt of another shape is not an approval: the thread is only resumable.
    other = PregelTask("t3", "agent", (), interrupts=(Interrupt(value="something", id="i2"),))
    assert thread_of(_snapshot(other, messages=3)) == RESUMABLE


@pytest.mark.parametrize("status", ["completed", "cancelled", "waiting"])
def test_a_run_that_stopped_as_it_should_ends_with_end(status: str) -> None:
    event = terminal_event("c", "r", status, "IGNORED", "ignored")
    assert event == End(conversation="c", run="r", status=status)
    assert event_type(event) is EventType.END
    assert body(event) == {"conversation": "c", "run": "r", "status": status}


@pytest.mark.parametrize("status", ["failed", "interrupted"])
def test_any_other_ending_is_a_chat_error_with_its_code(status: str) -> None:
    event = terminal_event("c", "r", status, "CODE", "why")
    assert isinstance(event, ChatError) and event_type(event) is EventType.CHAT_ERROR
    expected = {"conversation": "c", "run": "r", "status": status, "code": "CODE", "message": "why"}
    assert body(event) == expected


def test_event_shapes_are_frozen() -> None:
    approval = Approval(conversation="c", run="r", requests=REQUESTS)
    assert event_type(approval) is EventType.APPROVAL
    with pytest.raises(AttributeError):
        approval.run = "other"  # type: ignore[misc]
    assert msgspec.json.decode(msgspec.json.encode(approval), type=Approval) == approval


def test_the_worker_publishes_an_ending_within_what_the_relay_waits_for() -> None:
    """After the outcome is committed the ending waits for the publisher's close, then runs
    its script, each bounded; a relay that finds the run finished and its stream short waits
    ``ENDING_PUBLISHED_WITHIN`` before it takes the stream as expired (api/chat/relay.py)."""
    from shared.contracts.events import ENDING_PUBLISHED_WITHIN
    from worker.run.publish.events import FLUSH_TIMEOUT, WRITE_TIMEOUT

    assert FLUSH_TIMEOUT + WRITE_TIMEOUT < ENDING_PUBLISHED_WITHIN
