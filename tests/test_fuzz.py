"""Bad input, generated and by hand, against a running API (and worker).

schemathesis reads ``/schema/openapi.json`` and sends a bounded number of
generated requests to every operation, valid and invalid ones. Whatever it
sends: no 5xx, every 4xx is the error envelope, and nothing is stored for a
request that was refused. The hand-written cases cover what a generator built
from the schema does not send: bodies that are not JSON, not UTF-8, huge or
deeply nested, NUL bytes, a message exactly at the size limit and one over.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis as redis_sync
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from shared.redis.keys import ACTIVE_RUNS, QUEUE_NAME
from tests.fakes.ollama import FakeOllama
from tests.support.env import SophosEnv
from tests.support.http import http_client
from tests.support.redis_server import RedisServer
from tests.support.stacks import module_stack

MAX_MESSAGE_CHARS = 200
MAX_BODY_BYTES = 64 * 1024

#: (conversation, run) of every request the API accepted during this module.
ACCEPTED: set[tuple[str, str]] = set()


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer, fake_ollama: FakeOllama
) -> Iterator[SophosEnv]:
    """One worker and one API for the whole module (each generated case is one request)."""
    with module_stack(
        tmp_path_factory.mktemp("fuzz"), redis_server.url, fake_ollama,
        RATE_LIMIT_PER_MINUTE="0", MAX_STREAMS_PER_CLIENT="0",
        MAX_MESSAGE_CHARS=str(MAX_MESSAGE_CHARS), MAX_BODY_BYTES=str(MAX_BODY_BYTES),
    ) as stack:
        yield stack.env


def openapi_document() -> dict[str, Any]:
    """The document the API serves at /schema/openapi.json, built in-process at collection time.

    (schemathesis's fixture-based loader does not work with pytest 9; the test below
    checks that the running API serves exactly this document.)
    """
    from litestar.serialization import encode_json

    from api.app import create_app
    from shared.settings import Settings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # Litestar 3 notices, not ours to fix here
        document = create_app(Settings()).openapi_schema.to_schema()
    return dict(json.loads(encode_json(document)))


DOCUMENT = openapi_document()
schema = schemathesis.openapi.from_dict(DOCUMENT)


def test_the_running_api_serves_the_document_being_fuzzed(stack: SophosEnv) -> None:
    with http_client(base_url=stack.api_url, timeout=10) as http:
        served = http.get("/schema/openapi.json").json()
    assert served == DOCUMENT
    assert len(DOCUMENT["paths"]) >= 8


#: the Agent Protocol's run URLs (api/protocol/): ``Content-Location`` of an accepted run
PROTOCOL_RUN = re.compile(r"/threads/([0-9a-f-]{36})/runs/([0-9a-f-]{36})")


def error_envelope(ctx: Any, response: Any, case: Any) -> bool | None:
    """Every 4xx names its problem as ``{"error": {"code", "message"}}`` and nothing else (the Agent
    Protocol's routes add the Agent Server's ``detail``, the same message: docs/agent-protocol.md)."""
    if 400 <= response.status_code < 500:
        body = json.loads(response.content)
        # (Not a 405: the app answers it before any route's handlers.)
        protocol = not case.path.startswith("/api") and response.status_code != 405
        assert set(body) == ({"error", "detail"} if protocol else {"error"}), body
        assert set(body["error"]) == {"code", "message"}, body
        assert body["error"]["code"] and body["error"]["message"], body
        assert not protocol or body["detail"] == body["error"]["message"], body
    return None


@schema.parametrize()
@settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
def test_generated_requests_get_no_5xx_and_every_4xx_is_an_envelope(case: Any, stack: SophosEnv) -> None:
    response = case.call(base_url=stack.api_url, timeout=20)
    case.validate_response(response, checks=[not_a_server_error, error_envelope])
    if case.method.upper() == "POST" and response.status_code == 202:
        body = response.json()
        if "run" in body and "conversation" in body:
            ACCEPTED.add((body["conversation"], body["run"]))
    # A run accepted through the Agent Protocol names itself in Content-Location.
    found = PROTOCOL_RUN.fullmatch(response.headers.get("content-location", ""))
    if case.method.upper() == "POST" and found:
        ACCEPTED.add((found[1], found[2]))


# --- by hand -----------------------------------------------------------------------------------


def post_raw(env: SophosEnv, content: bytes, content_type: str = "application/json") -> httpx.Response:
    with http_client(base_url=env.api_url, timeout=20) as http:
        return http.post("/api/chat", content=content, headers={"Content-Type": content_type})


def refused(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and body["error"]["code"] == code, body
    return str(body["error"]["message"])


def accepted(response: httpx.Response) -> None:
    assert response.status_code == 202, response.text
    ACCEPTED.add((response.json()["conversation"], response.json()["run"]))


def test_bodies_no_schema_describes(stack: SophosEnv) -> None:
    exactly = "é" * MAX_MESSAGE_CHARS  # characters, not bytes, are counted
    accepted(post_raw(stack, json.dumps({"message": exactly}).encode()))
    assert "longer than" in refused(
        post_raw(stack, json.dumps({"message": exactly + "x"}).encode()), 400, "BAD_REQUEST"
    )
    refused(post_raw(stack, b'{"message": "hi\\u0000there"}'), 400, "BAD_REQUEST")
    refused(post_raw(stack, b'{"message": "hi\x00there"}'), 400, "BAD_REQUEST")  # raw NUL: not JSON
    refused(post_raw(stack, b'{"message": "caf\xe9"}'), 400, "BAD_REQUEST")  # Latin-1, not UTF-8
    refused(post_raw(stack, b'{"message": "\xed\xa0\x80"}'), 400, "BAD_REQUEST")  # a lone surrogate
    refused(post_raw(stack, b'{"message": "\\ud800"}'), 400, "BAD_REQUEST")
    refused(post_raw(stack, b"\xff\xfe{\x00}\x00"), 400, "BAD_REQUEST")
    refused(post_raw(stack, b""), 400, "BAD_REQUEST")
    refused(post_raw(stack, b"null"), 400, "BAD_REQUEST")
    refused(post_raw(stack, b'"message"'), 400, "BAD_REQUEST")
    refused(post_raw(stack, b'{"message": "hi"} trailing'), 400, "BAD_REQUEST")
    refused(post_raw(stack, b'{"message": "hi", "message": ""}'), 400, "BAD_REQUEST")
    refused(post_raw(stack, b'{"message": ["hi"]}'), 400, "BAD_REQUEST")
    refused(post_raw(stack, b'{"message": "hi", "resume": "yes"}'), 400, "BAD_REQUEST")
    refused(post_raw(stack, b'{"message": "hi", "conversation": 7}'), 400, "BAD_REQUEST")
    refused(post_raw(stack, b'{"message": "hi", "conversation": "../../etc/passwd"}'), 400, "BAD_REQUEST")
    refused(post_raw(stack, b'{"message": "hi", "conversation": "\\u0000"}'), 400, "BAD_REQUEST")
    nested = b'{"message": "hi", "extra": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert len(nested) > MAX_BODY_BYTES
    refused(post_raw(stack, nested), 413, "PAYLOAD_TOO_LARGE")
    deep = b'{"message": "hi", "extra": ' + b"[" * 30_000 + b"]" * 30_000 + b"}"
    assert len(deep) < MAX_BODY_BYTES
    response = post_raw(stack, deep)  # within the size limit: unknown fields are ignored
    assert response.status_code in (202, 400), response.text
    if response.status_code == 202:
        accepted(response)
    else:
        refused(response, 400, "BAD_REQUEST")
    refused(post_raw(stack, b'{"message": "' + b"a" * (MAX_BODY_BYTES + 1) + b'"}'), 413, "PAYLOAD_TOO_LARGE")
    refused(post_raw(stack, b"message=hi", "application/x-www-form-urlencoded"), 400, "BAD_REQUEST")


def test_a_huge_body_sent_in_chunks_is_refused_without_reading_it_all(stack: SophosEnv) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"message": "'
        for _ in range(1024):  # 64 MiB, far over the limit, with no Content-Length
            yield b"a" * 65536
        yield b'"}'

    with http_client(base_url=stack.api_url, timeout=30) as http:
        try:
            response = http.post("/api/chat", content=chunks(), headers={"Content-Type": "application/json"})
        except httpx.TransportError:
            return  # the server answered and closed while we were still sending: refused early
    refused(response, 413, "PAYLOAD_TOO_LARGE")


def test_nothing_is_stored_for_a_refused_request(stack: SophosEnv) -> None:
    """Runs after the generated and hand-written requests: only accepted ones left a trace."""
    with http_client(base_url=stack.api_url, timeout=20) as http:
        conversations = {c["id"] for c in http.get("/api/conversations").json()["conversations"]}
        runs = http.get("/api/runs", params={"limit": 500}).json()["runs"]
    assert conversations <= {conversation for conversation, _ in ACCEPTED}
    assert {(r["conversation"], r["id"]) for r in runs} <= ACCEPTED
    with redis_sync.Redis.from_url(stack.redis_url, decode_responses=True) as client:
        claimed = set(client.hgetall(ACTIVE_RUNS).items())
        queued = set(client.zrange(QUEUE_NAME, 0, -1))
    assert claimed <= ACCEPTED
    assert queued <= {run for _, run in ACCEPTED}
    assert Path(stack.database_path).exists()
