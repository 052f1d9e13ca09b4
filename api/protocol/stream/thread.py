"""A thread's stream (``threads.join_stream``, ``GET /threads/{id}/stream``): every run of the
thread, one after the other, as they come, until the client leaves.

Each run is streamed as its own stream is (:class:`~api.protocol.stream.relay.ProtocolStream`,
in the modes the run was created with: the Agent Server's ``run_modes``), beginning with a
``metadata`` part naming it, from its first event: the run holding the thread when the client
joins, then each run waiting behind it, then each run accepted later. Between runs the stream
waits on the thread's ``thread_runs_channel`` (the submit script publishes every run accepted
for the conversation there, shared/redis/scripts/), sending pings meanwhile: it is woken, not
polling. Subscribed before it looks for a run, so a run accepted in between is not missed; a run
that began and ended while the one before it was streamed is streamed all the same. (Pub/sub
keeps nothing for a connection that dropped: at each ping it also looks at the thread.)

A part's id is ``<run id>:<the run's own id>``: a client that comes back with it as
``Last-Event-ID`` gets that run from after that part (its end too, if it ended meanwhile), then
the runs of the thread from then on.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import structlog

from api.chat.relay import PING
from api.protocol.stream.relay import ProtocolStream, encode
from api.protocol.stream.translate import Part, after_id
from api.resources import Resources
from shared.contracts.jobs import is_delete_claim
from shared.contracts.protocol import ASSISTANT_ID
from shared.errors import BadRequest
from shared.redis.keys import ACTIVE_RUNS, thread_runs_channel, waiting_key

log = structlog.get_logger(__name__)

#: the ``stream_mode`` of ``threads.join_stream`` served: each run's own modes
RUN_MODES = "run_modes"
_RESUME = re.compile(r"([0-9a-fA-F-]{36}):(.+)")


def thread_after(last_event_id: str | None) -> tuple[str, tuple[int, int]] | None:
    """The run and the part of it a thread stream's ``Last-Event-ID`` names; None: from now."""
    if last_event_id is None or last_event_id.strip() in ("", "-1"):
        return None
    found = _RESUME.fullmatch(last_event_id.strip())
    if found is None:
        raise BadRequest(
            "Last-Event-ID of a thread's stream is <run id>:<event id> (from this stream), "
            f"got {last_event_id.strip()[:48]!r}"
        )
    return found.group(1).lower(), after_id(found.group(2))


def thread_modes(asked: list[str]) -> None:
    """``stream_mode`` of a thread's stream: ``run_modes`` only (the others refused by name)."""
    other = [m for m in asked if m != RUN_MODES]
    if other:
        raise BadRequest(
            f"stream_mode {other[0][:32]!r} of a thread's stream is not served by Sophos: "
            f"{RUN_MODES} only, each run in its own modes (docs/agent-protocol.md)"
        )


@dataclass(slots=True)
class ThreadStream:
    resources: Resources
    thread_id: str
    #: a run's own stream modes (``ProtocolRuns.options``)
    modes_of: Callable[[str], Awaitable[tuple[str, ...]]]
    after: tuple[str, tuple[int, int]] | None = None

    async def _runs_now(self) -> list[str]:
        """The run holding the thread and those waiting behind it, in their order."""
        redis = self.resources.redis
        holder: str | None = await redis.hget(ACTIVE_RUNS, self.thread_id)  # type: ignore[misc]
        waiting: list[str] = await redis.lrange(waiting_key(self.thread_id), 0, -1)  # type: ignore[misc]
        return [*([holder] if holder and not is_delete_claim(holder) else []), *waiting]

    async def _run(self, run_id: str, after: tuple[int, int]) -> AsyncIterator[bytes]:
        stream = ProtocolStream(
            self.resources, self.thread_id, run_id, ASSISTANT_ID, await self.modes_of(run_id), after
        )
        await stream.open()
        if after == (0, -1):
            yield encode(Part("metadata", {"run_id": run_id, "thread_id": self.thread_id}))
        async for part in stream.parts():
            yield PING if part is None else encode(Part(part.event, part.data, f"{run_id}:{part.id}"))

    async def sse(self) -> AsyncIterator[bytes]:
        redis, settings = self.resources.redis, self.resources.settings
        pubsub = redis.pubsub()
        await pubsub.subscribe(thread_runs_channel(self.thread_id))
        try:
            # Subscribed first: a run accepted from now on is announced; the ones accepted
            # before hold the thread or wait behind it now, and come first.
            streamed: set[str] = set()
            due = await self._runs_now()
            if self.after is not None:
                run_id, after = self.after
                streamed.add(run_id)
                async for chunk in self._run(run_id, after):
                    yield chunk
            while not self.resources.draining.is_set():
                # Every run announced meanwhile, in the order accepted: one that began and
                # ended while the previous one was streamed is streamed all the same.
                while (message := await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.0)):
                    due.append(str(message["data"]))
                next_run = next((r for r in due if r not in streamed), None)
                if next_run is None:
                    due.clear()
                    woken = await pubsub.get_message(
                        ignore_subscribe_messages=True, timeout=settings.sse_ping_interval
                    )
                    if woken is None:  # an announcement is not kept: look at the thread too
                        yield PING
                        due.extend(await self._runs_now())
                    else:
                        due.append(str(woken["data"]))
                    continue
                streamed.add(next_run)
                log.info("protocol.thread_stream_run", conversation_id=self.thread_id, run_id=next_run)
                async for chunk in self._run(next_run, (0, -1)):
                    yield chunk
        finally:
            await pubsub.unsubscribe()
            await pubsub.aclose()
