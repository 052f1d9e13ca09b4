"""Webhooks' URL policy and what is shown of a URL (shared/contracts/webhooks.py), and the enqueueing's
arguments: pure, no process. The delivery itself is tests/test_webhooks.py; the pinned transport
it shares with the fetch tool is tested in tests/test_secrets.py (a name that rebinds between
check and connect never reaches loopback)."""

from __future__ import annotations

import json

import pytest

from shared.contracts.codec import loads
from shared.contracts.webhooks import (
    WEBHOOK_FUNCTION,
    WebhookPolicy,
    WebhookRefused,
    hook_keys_args,
    shown,
    webhook_job_id,
)
from shared.redis.keys import QUEUE_NAME, WAKE_LIST, arq_job_key, protocol_run_key
from shared.settings import Settings

STRICT = WebhookPolicy()
OPEN = WebhookPolicy(allow_http=True, allow_private=True)


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://example.com/hook", "must be https (plain http only with WEBHOOK_ALLOW_HTTP), not http"),
        ("ftp://example.com/hook", "not ftp"),
        ("example.com/hook", "not none"),
        ("https:///hook", "has no host"),
        ("https://example.com:99999/hook", "not a URL"),
        ("https://example.com/" + "a" * 2048, "at most 2048"),
    ],
)
def test_a_malformed_or_plain_url_is_refused_by_its_form(url: str, problem: str) -> None:
    with pytest.raises(WebhookRefused, match=r"^webhook: ") as refused:
        STRICT.parse(url)
    assert problem in str(refused.value)


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1", "10.1.2.3", "192.168.0.1", "169.254.169.254", "100.100.100.200", "::1", "fd00:ec2::254"],
)
async def test_a_non_public_address_is_refused_unless_allowed(address: str) -> None:
    host = f"[{address}]" if ":" in address else address
    with pytest.raises(WebhookRefused, match=r"loopback, private or link-local .*WEBHOOK_ALLOW_PRIVATE"):
        await STRICT.check(f"https://{host}/hook")
    await OPEN.check(f"http://{host}/hook")
    assert STRICT.allowed("93.184.216.34")


async def test_a_name_is_resolved_and_every_address_checked() -> None:
    with pytest.raises(WebhookRefused, match=r"localhost \((127\.0\.0\.1|::1)\) is a loopback"):
        await STRICT.check("https://localhost/hook")
    with pytest.raises(WebhookRefused, match="does not resolve"):
        await STRICT.check("https://nothing.invalid/hook")


def test_the_policy_comes_from_the_settings() -> None:
    assert WebhookPolicy.of(Settings()) == STRICT
    settings = Settings.from_env({"WEBHOOK_ALLOW_HTTP": "1", "WEBHOOK_ALLOW_PRIVATE": "true"})
    assert WebhookPolicy.of(settings) == OPEN


def test_a_url_is_shown_without_its_query_fragment_or_credentials() -> None:
    assert shown("https://user:pw@hooks.example.com:8443/a/b?token=s3cret#x") == "https://hooks.example.com:8443/a/b"
    assert shown("http://[::1]:9/h?k=v") == "http://[::1]:9/h"
    assert "s3cret" not in shown("https://[bad/?token=s3cret")


def test_the_enqueueing_names_one_job_per_run() -> None:
    keys, args = hook_keys_args("run-1", "conversation-1", now=12.5)
    assert keys == [protocol_run_key("run-1"), arq_job_key("webhook:run-1"), QUEUE_NAME, WAKE_LIST]
    job_id, payload, _ttl, score = args
    assert job_id == webhook_job_id("run-1") == "webhook:run-1" and score == "12500"
    job = loads(payload)
    assert job["f"] == WEBHOOK_FUNCTION
    assert json.loads(json.dumps(job["a"])) == [
        {"run_id": "run-1", "conversation_id": "conversation-1", "enqueued_at": 12.5}
    ]
