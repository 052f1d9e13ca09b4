"""Jobs as frozen structs with one codec, and one arq entry-point decorator (issue 39, part 3).

Every job goes into arq's record and comes back unchanged through the one codec
(shared/contracts/codec.py); a payload that is not its job is a clear error; and every function
the worker registers with arq decodes, binds the log context and calls through worker/entry.py.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import structlog
from arq.jobs import serialize_job

from shared.contracts.assistants import AgentConfig, AssistantWrite
from shared.contracts.codec import PayloadError, decode, dumps, encode, job_of_record, job_record, loads
from shared.contracts.crons import CronCreate, CronDelete, CronUpdate
from shared.contracts.jobs import Decision, DecisionAction, DeleteJob, JobKind, PruneJob, RenameJob, RunJob
from shared.contracts.webhooks import WebhookJob
from shared.settings import Settings
from worker.entry import entry_point
from worker.jobs import functions

ROOT = Path(__file__).resolve().parents[2]
RUN = "0b6c2f1e-3d4a-4b5c-8d9e-0f1a2b3c4d5e"
CONVERSATION = "5f0c2f1e-3d4a-4b5c-8d9e-0f1a2b3c4d5e"

JOBS: list[Any] = [
    RunJob(RUN, CONVERSATION, JobKind.DECIDE, None, 1.5, decisions=(
        encode(Decision("call-1", DecisionAction.EDIT, {"q": "x"})),
        encode(Decision("call-2", DecisionAction.REJECT)),
    ), may_wait=True),
    DeleteJob(CONVERSATION, "delete:1", 2.0, reason="retention"),
    RenameJob(CONVERSATION, "A title ✓", "rename:1", 3.0),
    WebhookJob(RUN, CONVERSATION, 4.0),
    CronCreate("cron-1", None, "*/5 * * * *", "tick", {"k": [1, 2]}, 5.0, "cron:1"),
    CronDelete("cron-1", "cron:2"),
    CronUpdate("cron-1", "cron:3", 5.5, "*/2 * * * * *", "tock", {"k": 2}, enabled=False),
    RunJob(RUN, CONVERSATION, JobKind.RUN, "hi", 6.0, agent=AgentConfig(
        "a-1", 2, "You are terse.", "other-model", ("tools__echo",), ("tools",))),
    AssistantWrite("update", "a-1", "assistant:1", 7.0, "alice", context={"model": "m"}, metadata={"k": 1}),
    PruneJob("prune:1", 8.0, "2026-12-07T12:00:00.000Z", CONVERSATION, 3),
]


@pytest.mark.parametrize("job", JOBS, ids=lambda job: type(job).__name__)
def test_every_job_goes_through_arqs_record_unchanged(job: Any) -> None:
    record = job_record("some_function", job, 1_700_000_000.0)
    assert job_of_record(type(job), record) == job
    assert decode(type(job), loads(dumps(encode(job)))) == job


def test_a_decision_goes_through_the_codec_unchanged() -> None:
    edit = Decision("c", DecisionAction.EDIT, {"a": 1}, "why")
    for decision in (Decision("c", DecisionAction.APPROVE), edit):
        assert decode(Decision, loads(dumps(encode(decision)))) == decision


def test_a_payload_that_is_not_its_job_is_a_clear_error() -> None:
    with pytest.raises(PayloadError, match=r"not a RunJob: Object missing required field `conversation_id`"):
        decode(RunJob, {"run_id": RUN, "kind": "run", "message": "hi", "enqueued_at": 1})
    with pytest.raises(PayloadError, match=r"not a RunJob: Invalid enum value 'later' - at `\$.kind`"):
        decode(RunJob, {"run_id": RUN, "conversation_id": CONVERSATION, "kind": "later", "message": None,
                        "enqueued_at": 1})
    with pytest.raises(PayloadError, match="not a DeleteJob"):
        decode(DeleteJob, ["not", "a", "dict"])
    with pytest.raises(PayloadError, match="not an arq job record"):
        job_of_record(RunJob, b"\x80pickled?")
    two = serialize_job("f", ({}, {}), {}, None, 1, serializer=dumps)
    with pytest.raises(PayloadError, match="2 arguments"):
        job_of_record(RunJob, two)


async def test_the_entry_point_decodes_binds_the_log_context_and_calls() -> None:
    seen: list[tuple[Any, dict[str, Any]]] = []

    @entry_point(WebhookJob)
    async def handler(ctx: dict[str, Any], job: WebhookJob) -> str:
        seen.append((job, structlog.contextvars.get_contextvars()))
        return "done"

    ctx = {"job_id": "webhook:1", "job_try": 1}
    assert await handler(ctx, encode(WebhookJob(RUN, CONVERSATION, 1.0))) == "done"
    assert seen == [(WebhookJob(RUN, CONVERSATION, 1.0),
                     {"run_id": RUN, "conversation_id": CONVERSATION, "job_id": "webhook:1"})]
    assert structlog.contextvars.get_contextvars() == {}  # unbound after the job
    with pytest.raises(PayloadError):
        await handler(ctx, {"run_id": RUN})
    assert len(seen) == 1  # a bad payload never reaches the handler


def test_every_function_the_worker_registers_is_an_entry_point() -> None:
    registered = functions(Settings())
    assert len(registered) == 10  # prune_checkpoints: worker/upkeep/pruning.py
    for function in registered:
        wrapped = getattr(function.coroutine, "__wrapped__", None)
        assert wrapped is not None, f"{function.name}: make it an entry point (worker/entry.py)"


def test_no_job_is_turned_into_a_dict_by_hand() -> None:
    contracts = ROOT / "shared" / "contracts"
    by_hand = [
        f"{path.relative_to(ROOT)}: {node.name}"
        for path in sorted(contracts.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef) and node.name in ("to_dict", "from_dict")
    ]
    assert by_hand == []
    assert all(dataclasses.is_dataclass(job) and type(job).__dataclass_params__.frozen for job in JOBS)  # type: ignore[attr-defined]
