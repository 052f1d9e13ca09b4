"""Delivering a run's webhook (shared/contracts/webhooks.py): one POST after the run ended, retried, recorded.

The delivery job is enqueued by the script that ended the run, so it never holds the run or its
events back: the run's terminal event is published before the job exists. Each attempt:

1. reads the run's protocol record; a record already ``delivered`` or ``failed`` (the job run
   twice: arq delivers at least once) sends nothing more;
2. builds the body: the run as ``runs.get`` answers it (shared/contracts/protocol.py), plus the thread's
   ``values``, the run's ``error`` when it failed, and ``webhook_sent_at``;
3. checks the URL against the policy again (settings may have changed since the run was
   created) and POSTs it through :class:`shared.pinned.PinnedTransport`: the host is resolved
   once, every address checked, and one of those very addresses connected to. No redirect is
   followed;
4. records the attempt (``webhook_attempts``, ``webhook_last_status``), logs it (the URL without
   its query: it may hold a secret) and counts it. A 2xx answer is ``delivered``. Anything else
   (another status, a refused or failed connection, a timeout) is tried again after
   ``WEBHOOK_RETRY_SECONDS * 2**(n-1)`` seconds, up to ``WEBHOOK_ATTEMPTS`` attempts in all;
   then the delivery is ``failed``.

An attempt is bounded by ``WEBHOOK_TIMEOUT`` as a whole, and its job's in-progress marker is cut
to a little more than that: a worker that dies during an attempt leaves the job to be taken
again, as the next attempt, soon after.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import httpx
import structlog
from arq.constants import in_progress_key_prefix
from arq.worker import Retry
from langgraph.graph.state import CompiledStateGraph
from redis.asyncio import Redis

from shared.contracts.protocol import RunRecord, sdk_run, values_of
from shared.contracts.runs import RunStatus
from shared.contracts.webhooks import WebhookJob, WebhookPolicy, WebhookRefused, shown
from shared.pinned import PinnedTransport
from shared.redis.ended import recorded
from shared.redis.keys import protocol_run_key
from shared.redis.metrics import METRICS_KEY, WEBHOOK_DELIVERIES, counter_field
from shared.settings import Settings
from shared.storage.schema import now_iso
from shared.storage.threads.branch import thread_config
from worker.entry import entry_point
from worker.store import RunStore

log = structlog.get_logger(__name__)

#: attempts arq may start beyond WEBHOOK_ATTEMPTS: a worker killed mid-attempt makes arq start
#: the job again, and the job then records the delivery failed rather than vanish unrecorded
SPARE_TRIES = 3
#: seconds an attempt's in-progress marker outlives WEBHOOK_TIMEOUT: a worker killed during the
#: attempt leaves the job to be taken again once it lapses (the worker's markers last a day)
IN_PROGRESS_MARGIN = 10.0


@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt's outcome: ``delivered`` or not, and what the receiver answered (or the error)."""

    delivered: bool
    status: str


@dataclass(frozen=True, slots=True)
class WebhookDelivery:
    settings: Settings
    redis: Redis
    store: RunStore
    graph: CompiledStateGraph[Any, Any, Any, Any]

    async def deliver(self, job: WebhookJob, attempt: int, job_id: str | None = None) -> str:
        """Attempt ``attempt`` (1-based) of the job; raises :class:`Retry` for the next one."""
        if job_id is not None:
            # The marker the worker set when it took the job lasts a day: an attempt cut by the
            # worker's death is taken again (by any worker) once this shorter one lapses.
            ttl = self.settings.webhook_timeout + IN_PROGRESS_MARGIN
            await self.redis.pexpire(in_progress_key_prefix + job_id, int(ttl * 1000))
        key = protocol_run_key(job.run_id)
        record = RunRecord.parse(_text(await self.redis.hgetall(key)))  # type: ignore[misc]
        if record.webhook is None:
            log.warning("webhook.record_gone")  # kept PROTOCOL_RUN_RETENTION_SECONDS
            return "gone"
        if record.webhook_outcome in ("delivered", "failed"):
            return record.webhook_outcome
        url, most = record.webhook, self.settings.webhook_attempts
        if attempt > most:  # arq started it again after a kill during the last attempt
            await self._record(key, "failed", attempt - 1, record.webhook_last_status or "interrupted")
            return "failed"
        result = await self._post(url, await self.body(job, record))
        if result.delivered:
            await self._record(key, "delivered", attempt, result.status, delivered_at=now_iso())
            log.info("webhook.delivered", url=shown(url), attempt=attempt, status=result.status)
            return "delivered"
        if attempt >= most:
            await self._record(key, "failed", attempt, result.status)
            log.error("webhook.failed", url=shown(url), attempt=attempt, status=result.status, attempts=most)
            return "failed"
        await self._record(key, "pending", attempt, result.status)
        delay = self.settings.webhook_retry_seconds * 2 ** (attempt - 1)
        log.warning("webhook.retrying", url=shown(url), attempt=attempt, status=result.status, retry_in=delay)
        raise Retry(defer=delay)

    async def body(self, job: WebhookJob, record: RunRecord) -> dict[str, Any]:
        """The run as ``runs.get`` answers it, the thread's ``values`` and, when it failed, its error."""
        # Its row, or for a run that ended without one (cancelled while queued, dropped, refused by
        # the database), what Redis recorded; a record gone meanwhile reads as a failure.
        found = await recorded(self.redis, job.run_id, self.store.get_run)
        row = found.row if found is not None else None
        status = found.status if found is not None else RunStatus.FAILED
        times = (row.enqueued_at, row.started_at, row.finished_at) if row is not None else (None, None, None)
        error: dict[str, Any] | None = None
        if row is not None and row.error_code:
            error = {"error": row.error_code, "message": row.error_message or ""}
        body = sdk_run(
            run_id=job.run_id, thread_id=job.conversation_id, status=status, created_at=times[0],
            started_at=times[1], finished_at=times[2], metadata=record.metadata,
            multitask_strategy=record.multitask_strategy, stream_mode=record.stream_mode,
            error_code=row.error_code if row is not None else None, assistant_id=record.assistant_id,
        )
        body["values"] = await self._values(job.conversation_id)
        if error is not None:
            body["error"] = error
        body["webhook_sent_at"] = now_iso()
        return body

    async def _values(self, conversation_id: str) -> dict[str, Any]:
        """The ``values`` of the branch the conversation follows (after a rollback or a switch, the
        thread's newest checkpoints are the branch it left)."""
        try:
            config = await thread_config(self.store.db.fetchall, conversation_id)
            return values_of(await self.graph.aget_state(config))
        except Exception as exc:  # a thread it cannot read: the run is told all the same
            log.warning("webhook.values_unreadable", error=f"{type(exc).__name__}: {exc}")
            return {}

    async def _post(self, url: str, body: dict[str, Any]) -> Attempt:
        policy = WebhookPolicy.of(self.settings)
        try:
            policy.parse(url)
        except WebhookRefused as exc:
            return Attempt(False, str(exc))
        transport = PinnedTransport(allowed=policy.allowed)
        try:
            # httpx's timeout bounds each read and write; this bounds the attempt as a whole.
            async with asyncio.timeout(self.settings.webhook_timeout), httpx.AsyncClient(
                transport=transport, timeout=self.settings.webhook_timeout, trust_env=False,
                follow_redirects=False,
            ) as http:
                response = await http.post(url, json=body, headers={"User-Agent": "sophos-webhook"})
        except TimeoutError:
            return Attempt(False, "TimeoutError: timed out")
        except httpx.HTTPError as exc:
            # The error's text may name the URL: only its kind and the host's refusal are kept.
            return Attempt(False, f"{type(exc).__name__}: {_reason(exc)}")
        return Attempt(200 <= response.status_code < 300, str(response.status_code))

    async def _record(
        self, key: str, outcome: str, attempts: int, last_status: str, *, delivered_at: str | None = None
    ) -> None:
        fields = {
            "webhook_outcome": outcome, "webhook_attempts": str(attempts), "webhook_last_status": last_status,
        }
        if delivered_at is not None:
            fields["webhook_delivered_at"] = delivered_at
        counted = "retried" if outcome == "pending" else outcome
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping=fields)
            pipe.hincrby(METRICS_KEY, counter_field(WEBHOOK_DELIVERIES, outcome=counted), 1)
            await pipe.execute()


def _text(fields: dict[Any, Any]) -> dict[str, str]:
    """A hash as text (the worker's Redis client, arq's, answers bytes)."""
    return {
        (k.decode() if isinstance(k, bytes) else str(k)): (v.decode() if isinstance(v, bytes) else str(v))
        for k, v in fields.items()
    }


def _reason(exc: httpx.HTTPError) -> str:
    text = str(exc)
    if isinstance(exc, httpx.TimeoutException):
        return "timed out"
    return "not a public address" if "not a public address" in text else "connection failed"


@entry_point(WebhookJob)
async def deliver_webhook(ctx: dict[str, Any], job: WebhookJob) -> str:
    """arq's entry point: deliver (the attempt is arq's ``job_try``)."""
    delivery: WebhookDelivery = ctx["webhooks"]
    return await delivery.deliver(job, int(ctx.get("job_try") or 1), ctx.get("job_id"))

