"""How a run that ended without a row is read from what Redis recorded (shared/redis/ended.py), and
which requests the per-client stream limit counts (api/http/limits.py): pure, no process."""

from __future__ import annotations

import json
from typing import Any

import pytest

from api.http.limits import EVENT_STREAM, FOLLOWS_A_RUN, follows_a_run
from shared.contracts.events import body, terminal_event
from shared.contracts.runs import RunStatus
from shared.redis.ended import Recorded, from_description, from_terminal_event
from shared.storage.rows import RunRow

CONVERSATION = "5f0c2f1e-3d4a-4b5c-8d9e-0f1a2b3c4d5e"
RUN = "0b6c2f1e-3d4a-4b5c-8d9e-0f1a2b3c4d5e"
QUEUED = {"conversation": CONVERSATION, "kind": "resume", "title": "t", "enqueued_at": "1767225600.5",
          "new_conversation": "0"}


def test_a_description_without_an_ending_is_a_queued_run() -> None:
    row = from_description(RUN, QUEUED)
    assert row is not None and row.status == RunStatus.QUEUED and row.kind == "resume"
    assert row.enqueued_at == "2026-01-01T00:00:00.500Z" and row.finished_at is None
    assert not Recorded(row, stored=False).ended


@pytest.mark.parametrize(
    ("ending", "status", "code"),
    [
        # cancelled while queued (the cancel's script)
        ({"status": "cancelled", "cancelled_at": "1767225601"}, RunStatus.CANCELLED, None),
        # dropped by the sweep, or refused when the worker took it (its code and message kept)
        ({"status": "failed", "failed_at": "1767225601", "error_code": "INTERRUPTED",
          "error_message": "never started"}, RunStatus.FAILED, "INTERRUPTED"),
    ],
)
def test_every_writer_of_a_rowless_ending_is_read_one_way(
    ending: dict[str, str], status: RunStatus, code: str | None
) -> None:
    # As the API's client answers it (text) and as the worker's does (bytes): the same run.
    for fields in ({**QUEUED, **ending}, {k.encode(): v.encode() for k, v in {**QUEUED, **ending}.items()}):
        row = from_description(RUN, fields)
        assert row is not None
        found = Recorded(row, stored=False)
        assert found.ended and found.status is status and found.code == code
        assert row.finished_at == "2026-01-01T00:00:01.000Z" and row.started_at is None


def test_a_description_not_written_by_this_code_is_no_record() -> None:
    assert from_description(RUN, {"status": "failed"}) is None


def _entry(event: Any) -> dict[str, str]:
    kind = "end" if event.__class__.__name__ == "End" else "chat-error"
    return {"type": kind, "data": json.dumps(body(event))}


@pytest.mark.parametrize("status", [s for s in RunStatus if s.finished])
def test_the_terminal_event_alone_says_how_the_run_ended(status: RunStatus) -> None:
    code = "AGENT_FAILURE" if status is RunStatus.FAILED else None
    event = terminal_event(CONVERSATION, RUN, status, code, "m")
    row = from_terminal_event(RUN, _entry(event), "2026-01-01T00:00:00.500Z")
    assert row is not None and row.status == status and row.conversation_id == CONVERSATION
    assert row.enqueued_at == "2026-01-01T00:00:00.500Z"
    assert row.error_code == ("AGENT_FAILURE" if status is RunStatus.FAILED else None)


def test_an_entry_that_is_no_ending_says_nothing() -> None:
    assert from_terminal_event(RUN, {"type": "token", "data": '"hi"'}, None) is None
    assert from_terminal_event(RUN, {"type": "end", "data": "not json"}, None) is None


def test_a_row_of_a_status_this_code_does_not_know_reads_as_completed() -> None:
    row = RunRow(id=RUN, conversation_id=CONVERSATION, kind="run", status="newer", error_code=None,
                 error_message=None, enqueued_at=None, started_at=None, finished_at=None, step_count=0)
    assert Recorded(row, stored=True).status is RunStatus.COMPLETED


class _Handler:
    def __init__(self, media_type: str | None = None, opt: dict[str, Any] | None = None) -> None:
        self.media_type, self.opt = media_type, opt or {}


@pytest.mark.parametrize(
    ("handler", "query", "counted"),
    [
        (_Handler(EVENT_STREAM), b"", True),
        (_Handler("application/json"), b"", False),
        (_Handler(opt={FOLLOWS_A_RUN: True}), b"", True),  # join, wait
        (_Handler(opt={FOLLOWS_A_RUN: "wait"}), b"wait=1", True),  # cancel?wait=1
        (_Handler(opt={FOLLOWS_A_RUN: "wait"}), b"wait=true", True),
        (_Handler(opt={FOLLOWS_A_RUN: "wait"}), b"wait=0", False),
        (_Handler(opt={FOLLOWS_A_RUN: "wait"}), b"", False),
    ],
)
def test_the_stream_limit_counts_what_follows_a_run(handler: _Handler, query: bytes, counted: bool) -> None:
    assert follows_a_run({"route_handler": handler, "query_string": query}) is counted  # type: ignore[typeddict-item]
