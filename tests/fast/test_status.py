"""A conversation's status and a run's error as the API shows them, from rows and Redis's claim."""

from __future__ import annotations

import pytest

from api.runs.status import conversation_status as _status
from api.runs.status import run_error
from api.store import ConversationRow
from shared.contracts.runs import RunErrorCode, RunStatus
from shared.storage.rows import RunRow

CONVERSATION = "5f0c2f1e-3d4a-4b5c-8d9e-0f1a2b3c4d5e"
RUN = "0b6c2f1e-3d4a-4b5c-8d9e-0f1a2b3c4d5e"


def _conversation(last_status: str | None) -> ConversationRow:
    return ConversationRow(
        id=CONVERSATION, title="t", created_at="2026-01-01T00:00:00+00:00",
        updated_at="2026-01-01T00:00:00+00:00", message_count=2, pending_tasks=False,
        last_run_id=RUN if last_status else None, last_status=last_status, last_error_code=None,
        last_error_message=None,
    )


def _run(status: str) -> RunRow:
    return RunRow(
        id=RUN, conversation_id=CONVERSATION, kind="run", status=status, error_code=None, error_message=None,
        enqueued_at=None, started_at=None, finished_at=None, step_count=0,
    )


@pytest.mark.parametrize("last", [None, *RunStatus])
def test_a_claimed_conversation_is_queued_until_the_worker_records_the_run(last: str | None) -> None:
    assert _status(_conversation(last), RUN, None) is RunStatus.QUEUED
    assert _status(_conversation(last), RUN, _run("running")) is RunStatus.RUNNING


@pytest.mark.parametrize("last", list(RunStatus))
def test_an_unclaimed_conversation_shows_its_last_run(last: RunStatus) -> None:
    assert _status(_conversation(last), None, None) is last


@pytest.mark.parametrize("last", [None, "", "from-a-newer-version"])
def test_no_last_run_or_an_unknown_status_shows_completed(last: str | None) -> None:
    assert _status(_conversation(last), None, None) is RunStatus.COMPLETED


def test_a_run_error_is_shown_for_failed_and_interrupted_runs_and_any_run_with_a_code() -> None:
    for status in (RunStatus.COMPLETED, RunStatus.CANCELLED, RunStatus.WAITING, RunStatus.RUNNING):
        assert run_error(status, None, None) is None
    interrupted = run_error(RunStatus.INTERRUPTED, None, None)
    assert interrupted is not None and interrupted.code == RunErrorCode.INTERRUPTED
    assert interrupted.message == "the run interrupted"
    failed = run_error(RunStatus.FAILED, None, "the model said no")
    assert failed is not None and failed.code == RunErrorCode.AGENT_FAILURE
    assert failed.message == "the model said no"
    coded = run_error(RunStatus.CANCELLED, "SOMETHING", None)
    assert coded is not None and coded.code == "SOMETHING"


def test_which_statuses_are_over() -> None:
    assert {s for s in RunStatus if s.finished} == set(RunStatus) - {RunStatus.QUEUED, RunStatus.RUNNING}
