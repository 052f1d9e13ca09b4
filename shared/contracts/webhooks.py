"""Webhooks of Agent Protocol runs: the URL policy, the delivery job's contract and its enqueueing.

A run created through the Agent Protocol with ``webhook`` has that URL called once, after the
run ends, whatever ends it. The API checks the URL when the run is created
(:meth:`WebhookPolicy.check`: refused, it is a 422 and nothing is enqueued) and keeps it in the
run's protocol record (``protocol_run_key``). Every script that ends a run in Redis
(shared/redis/scripts/) enqueues the delivery job in the same step, when that record has a
webhook: the worker's ending, the cancel of a queued run and the sweep's drop of a run that
never started. The job's id is deterministic (:func:`webhook_job_id`) and the record's
``webhook_outcome`` is set with HSETNX in the same script, so an ending retried enqueues no
second job. The worker delivers it (worker/schedule/webhooks.py), never in the run's own path. A run
that ended before the API wrote its record (a fast run: its ending found no webhook) has the
job enqueued by the API itself, just after it wrote the record (:func:`enqueue_delivery`).

The record's fields (kept as long as the record, ``PROTOCOL_RUN_RETENTION_SECONDS``):
``webhook`` (the URL), ``webhook_outcome`` (``pending``, ``delivered`` or ``failed``),
``webhook_attempts``, ``webhook_last_status`` (the receiver's HTTP status, or the error) and
``webhook_delivered_at``.
"""

from __future__ import annotations

import ipaddress
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from arq.constants import expires_extra_ms
from redis.asyncio import Redis

from shared.contracts.codec import job_record
from shared.pinned import is_public_address, resolve_checked
from shared.redis.keys import QUEUE_NAME, WAKE_LIST, arq_job_key, protocol_run_key
from shared.redis.scripts import scripts
from shared.settings import Settings

#: arq's name of the delivery job (worker/schedule/webhooks.py)
WEBHOOK_FUNCTION = "deliver_webhook"
#: longest webhook URL taken
MAX_URL_LENGTH = 2048
#: seconds the API may take to resolve a webhook's host when a run is created
RESOLVE_TIMEOUT = 5.0


def webhook_job_id(run_id: str) -> str:
    """The delivery job's arq id: one per run, so it is enqueued once."""
    return f"webhook:{run_id}"


@dataclass(frozen=True, slots=True)
class WebhookJob:
    """Payload of the delivery job; the URL is read from the run's protocol record."""

    run_id: str
    conversation_id: str
    enqueued_at: float


def shown(url: str) -> str:
    """``url`` as logs and messages may show it: scheme, host, port and path only. A query, a
    fragment or credentials often carry a receiver's secret."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        return "(a malformed URL)"
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}{port}{parts.path}"


class WebhookRefused(ValueError):
    """A webhook URL the policy refuses; the message names the problem (and no secret of it)."""


@dataclass(frozen=True, slots=True)
class WebhookPolicy:
    """Which webhook URLs are called: https only, to public addresses only, unless allowed."""

    allow_http: bool = False
    allow_private: bool = False

    @classmethod
    def of(cls, settings: Settings) -> WebhookPolicy:
        return cls(settings.webhook_allow_http, settings.webhook_allow_private)

    def allowed(self, address: str) -> bool:
        return self.allow_private or is_public_address(address)

    def parse(self, url: str) -> tuple[str, int]:
        """The URL's host and port, if its form is allowed; :class:`WebhookRefused` otherwise."""
        if len(url) > MAX_URL_LENGTH:
            raise WebhookRefused(f"webhook: a URL of at most {MAX_URL_LENGTH} characters")
        try:
            parts = urlsplit(url)
            host, port = parts.hostname, parts.port
        except ValueError:
            raise WebhookRefused("webhook: not a URL") from None
        schemes = ("https", "http") if self.allow_http else ("https",)
        if parts.scheme not in schemes:
            hint = "" if self.allow_http else " (plain http only with WEBHOOK_ALLOW_HTTP)"
            scheme = parts.scheme or "none"
            raise WebhookRefused(f"webhook: the URL must be {' or '.join(schemes)}{hint}, not {scheme}")
        if not host:
            raise WebhookRefused("webhook: the URL has no host")
        return host, port or (443 if parts.scheme == "https" else 80)

    async def check(self, url: str) -> None:
        """Refuse ``url`` unless its form is allowed and its host resolves only to allowed
        addresses. The delivery checks again, and connects to the addresses it checked."""
        host, port = self.parse(url)
        try:
            ipaddress.ip_address(host)
        except ValueError:
            pass
        else:
            if not self.allowed(host):
                raise WebhookRefused(self._private(host, host))
            return
        try:
            await resolve_checked(host, port, self.allowed, RESOLVE_TIMEOUT, refuse=self._refused)
        except WebhookRefused:
            raise
        except Exception as exc:  # it does not resolve, or not in time
            raise WebhookRefused(f"webhook: {host} does not resolve") from exc

    def _refused(self, host: str, address: str) -> WebhookRefused:
        return WebhookRefused(self._private(host, address))

    @staticmethod
    def _private(host: str, address: str) -> str:
        named = host if host == address else f"{host} ({address})"
        return (f"webhook: {named} is a loopback, private or link-local address "
                "(allowed only with WEBHOOK_ALLOW_PRIVATE)")


async def enqueue_delivery(redis: Redis, run_id: str, conversation_id: str) -> None:
    """Enqueue the run's delivery unless it was (the same ``hook_run`` as the endings': once)."""
    keys, args = hook_keys_args(run_id, conversation_id)
    await scripts(redis).hook(keys=keys, args=args)


def hook_keys_args(
    run_id: str, conversation_id: str, now: float | None = None
) -> tuple[list[str], list[Any]]:
    """The keys and arguments that every run-ending script takes for ``hook_run``
    (shared/redis/scripts/): the run's protocol record, the delivery job's record, the
    queue and the wake list; the job's id, its serialized record, its TTL and its score."""
    enqueued = time.time() if now is None else now
    enqueue_ms = int(enqueued * 1000)
    job_id = webhook_job_id(run_id)
    payload = job_record(WEBHOOK_FUNCTION, WebhookJob(run_id, conversation_id, enqueued), enqueued)
    keys = [protocol_run_key(run_id), arq_job_key(job_id), QUEUE_NAME, WAKE_LIST]
    return keys, [job_id, payload, str(expires_extra_ms), str(enqueue_ms)]
