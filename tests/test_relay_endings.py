"""A stream opened while its run is queued, of a run that then ends at once, is relayed in full.

A run's record is read row first, then Redis (shared/redis/ended.py). A run can be taken, run and
ended between the two reads: the row was not there yet, and Redis then holds the run's whole
stream, terminal event included. That run has a row and its events are kept for
``EVENT_RETENTION``: a client reading it from the start gets every event, never ``missed`` and an
ending rebuilt as though the stream had expired.

The window between the two reads is a few milliseconds wide; the test holds it open on the wire:
the API talks to Redis through a loopback relay of bytes that holds the one write asking for the
run's Redis record until the run has ended. Real worker, API and Redis; the model is the fake
Ollama.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

from redis.asyncio import Redis

from shared.redis.keys import events_key, run_key
from tests.fakes.ollama import FakeOllama, Text
from tests.support.client import chat_async, read_sse_async, wait_for_async
from tests.support.env import SophosEnv

NO_LIMITS = {"RATE_LIMIT_PER_MINUTE": 0, "MAX_STREAMS_PER_CLIENT": 0}


class HoldingRelay:
    """A TCP relay to Redis that, once :meth:`hold_first` is armed, holds the first write from a
    client that contains every one of the given byte strings, until :meth:`release`."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.held = threading.Event()
        self.released = threading.Event()
        self._patterns: tuple[bytes, ...] | None = None
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = [self.listener]
        self._closing = False
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, redis_url: str) -> str:
        parts = urlsplit(redis_url)
        return urlunsplit(parts._replace(netloc=f"127.0.0.1:{self.port}"))

    def hold_first(self, *patterns: bytes) -> None:
        with self._lock:
            self._patterns = patterns

    def release(self) -> None:
        self.released.set()

    def close(self) -> None:
        self._closing = True
        self.released.set()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _should_hold(self, chunk: bytes) -> bool:
        with self._lock:
            if self._patterns is None or not all(p in chunk for p in self._patterns):
                return False
            self._patterns = None  # the first such write only
        return True

    def _pump(self, source: socket.socket, target: socket.socket, from_client: bool) -> None:
        try:
            while chunk := source.recv(65536):
                if from_client and self._should_hold(chunk):
                    self.held.set()
                    self.released.wait()
                target.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (source, target):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def holding_relay(redis_url: str) -> Iterator[HoldingRelay]:
    parts = urlsplit(redis_url)
    relay = HoldingRelay((parts.hostname or "127.0.0.1", parts.port or 6379))
    try:
        yield relay
    finally:
        relay.close()


async def _ended_in_redis(redis: Redis, run: str) -> bool:
    newest = await redis.xrevrange(events_key(run), count=1)
    return bool(newest) and newest[0][1].get("type") == "end"


async def test_a_stream_opened_while_queued_gets_every_event_of_a_run_that_ended_meanwhile(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama, redis: Redis
) -> None:
    env = sophos_env.with_(**NO_LIMITS)
    with holding_relay(env.redis_url) as wire:
        api = start_api(env.with_(REDIS_URL=wire.url(env.redis_url)))  # no worker yet: it stays queued
        model.script(Text("every word of it arrives"))
        conversation, run = await chat_async(api.url, "answer me")

        # The stream's opening reads the run's row (none yet: queued), then asks Redis for the
        # run's record (its description and its stream's last entry, one write): held there.
        wire.hold_first(b"HGETALL", run_key(run).encode())
        reader = asyncio.create_task(read_sse_async(api.url, conversation, timeout=60))
        await wait_for_async(
            lambda: wire.held.is_set() or reader.done(), 20, message="the API to ask for the run's record"
        )
        assert not reader.done(), reader.result()

        # Meanwhile the run is taken, run and ended: its row is written, its events are all kept.
        start_worker(env)
        await wait_for_async(lambda: _ended_in_redis(redis, run), 30, message="the run to end")
        wire.release()

        events = await reader
    assert events.ended and events.types[-1] == "end", events.types
    assert "missed" not in events.types, events.types
    assert events.text == "every word of it arrives"
    assert [int(i) for i in events.ids if i is not None] == list(range(1, len(events) + 1))
    assert '"relay.expired"' not in api.log_text()
