"""The payloads and names both ends of the queue share (shared/contracts/codec.py)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

import pytest

from shared.contracts.codec import decode, dumps, encode, json_codec, loads, use_json_codec
from shared.contracts.events import EventType, text_of
from shared.contracts.jobs import DeleteJob, JobKind, RunJob, delete_claim, is_delete_claim
from shared.redis import keys as contracts

RUN = "0b6c2f1e-3d4a-4b5c-8d9e-0f1a2b3c4d5e"
CONVERSATION = "5f0c2f1e-3d4a-4b5c-8d9e-0f1a2b3c4d5e"


@pytest.fixture(params=["json", "msgspec"])
def codec(request: pytest.FixtureRequest) -> Iterator[str]:
    before = json_codec()
    use_json_codec(request.param)
    yield request.param
    use_json_codec(before)


def test_a_run_job_goes_through_the_queue_unchanged(codec: str) -> None:
    job = RunJob(RUN, CONVERSATION, JobKind.RUN, "héllo", 1_700_000_000.5, new_conversation=True)
    data = loads(dumps(encode(job)))
    assert "decisions" not in data  # a job without decisions looks as jobs always did
    assert decode(RunJob, data) == job
    decide = RunJob(RUN, CONVERSATION, JobKind.RUN, None, 1.0,
                    decisions=({"id": "call-1", "action": "approve", "arguments": None, "message": None},))
    assert decode(RunJob, loads(dumps(encode(decide)))) == decide
    assert "traceparent" not in data  # nor does one enqueued without tracing
    traced = dataclasses.replace(job, traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    assert decode(RunJob, loads(dumps(encode(traced)))) == traced
    assert "checkpoint_id" not in data  # nor without a checkpoint to start from
    switch = RunJob(RUN, CONVERSATION, JobKind.SWITCH, None, 1.0, checkpoint_id="1f0-checkpoint")
    assert decode(RunJob, loads(dumps(encode(switch)))) == switch


def test_a_job_from_before_new_fields_still_decodes() -> None:
    old = {"run_id": RUN, "conversation_id": CONVERSATION, "kind": "resume", "message": None,
           "enqueued_at": 3}
    job = decode(RunJob, old)
    assert job.kind is JobKind.RESUME and not job.new_conversation and job.decisions is None
    assert job.checkpoint_id is None  # the thread's latest checkpoint, as before branches
    delete = decode(DeleteJob, {"conversation_id": CONVERSATION, "claim": "c", "enqueued_at": 1})
    assert delete.reason == "request"


def test_a_delete_claim_is_never_a_run_id() -> None:
    claim = delete_claim(RUN)
    assert is_delete_claim(claim) and not is_delete_claim(RUN) and claim != RUN


def test_both_codecs_write_compact_utf8_and_read_each_other(codec: str) -> None:
    value = {"text": "naïve ✓", "n": 2**70, "f": 0.5, "list": [1, None, True], "kind": JobKind.RUN}
    encoded = dumps(value)
    assert b" " not in encoded.replace(b"na\xc3\xafve \xe2\x9c\x93", b"")
    assert "naïve ✓".encode() in encoded
    assert loads(encoded) == {**value, "kind": "run"}
    other = "msgspec" if codec == "json" else "json"
    use_json_codec(other)
    assert loads(encoded) == {**value, "kind": "run"}
    assert math.isnan(loads(b"NaN"))  # json's bare NaN is read by both
    assert dumps(ValueError("boom")) == b'"ValueError: boom"'  # a failed job's exception, as text
    with pytest.raises(TypeError):
        dumps(object())


@pytest.mark.parametrize(
    ("content", "text"),
    [
        ("plain", "plain"),
        (None, ""),
        ([{"type": "text", "text": "a"}, "b", {"type": "image_url", "image_url": "x"}, {"type": "text"}],
         "ab"),
        (42, "42"),
    ],
)
def test_the_text_of_any_content_shape(content: object, text: str) -> None:
    assert text_of(content) == text


def test_only_end_and_chat_error_are_terminal() -> None:
    assert {e for e in EventType if e.terminal} == {EventType.END, EventType.CHAT_ERROR}


def test_every_key_is_under_the_services_prefixes() -> None:
    keys = [contracts.run_key(RUN), contracts.events_key(RUN), contracts.cancel_key(RUN),
            contracts.progress_key(RUN), contracts.idempotency_key("k"), contracts.deleted_key("c"),
            contracts.cancelled_run_key(CONVERSATION), contracts.worker_heartbeat_key("w")]
    assert all(k.startswith("sophos:") for k in keys) and len(set(keys)) == len(keys)
    assert [contracts.arq_job_key(RUN), contracts.arq_in_progress_key(RUN), contracts.arq_retry_key(RUN)] == [
        f"arq:job:{RUN}", f"arq:in-progress:{RUN}", f"arq:retry:{RUN}"]
