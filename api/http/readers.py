"""Reader processes: where the API rebuilds threads, each read bounded, each process ending with the API.

Rebuilding a thread's messages is pure-Python CPU work (api/store.py ``read_thread``
says why it cannot run in the API's own process). It runs in a few child processes
of the API, ``python -m api.http.reader_process``, each serving one read at a time over a
socket. Why not ``concurrent.futures.ProcessPoolExecutor``, as before:

- A read that outlasts its bound, or whose client left, cannot be stopped in a
  pool: the task runs to its end and keeps the process busy, and killing one of the
  pool's processes breaks the whole pool (every other read in flight fails). Here
  the process of that one read is killed and another started in its place.
- A pool's processes outlived the API: stopped by its signal (uvicorn re-raises it
  once the app has shut down, so ``atexit`` never runs) or killed, the API left
  its readers and multiprocessing's resource tracker running, ~100 MB each time.
  Here the API kills its readers when it closes, and a reader whose API died
  without closing (SIGKILL) ends by itself: its stdin is a pipe whose only writer
  is the API, so the pipe's end means the API is gone, whatever ended it. On Linux
  the parent-death signal also kills it at once, even while a read holds the GIL.
  No multiprocessing machinery, hence no resource tracker.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, TypeVar

import anyio
import structlog

from api.http.reader_process import READY
from shared.errors import ReadTimedOut

log = structlog.get_logger(__name__)

T = TypeVar("T")

#: How long a reader may take to start (import LangGraph) before it is given up.
START_SECONDS = 60.0


class ReaderFailed(RuntimeError):
    """A reader process ended in the middle of a read, or never started (its stderr is in the log)."""


@dataclass(eq=False)
class _Reader:
    """One reader process and the API's end of its socket.

    A message is received in a thread, which a read given up (timed out, its client gone)
    leaves running: it cannot be stopped, and it may be between two ``read()`` calls of one
    message, each made on the socket's descriptor *number*. Closed under it, that number is
    soon given to the socket of the next reader started, and the old thread would then read
    the new reader's messages (its ``ready``, a reply), which its own reads then miss or find
    cut: "Ran out of input". So :meth:`kill` shuts the socket down, which wakes the thread (its
    reads end), and the descriptor is closed by whichever of the two comes last.
    """

    popen: subprocess.Popen[bytes]
    conn: Connection
    #: time.monotonic() when it last finished a read (or started)
    idle_since: float = 0.0
    #: guards the two flags below, which decide who closes the descriptor
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _receiving: bool = False
    _killed: bool = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    async def receive(self) -> Any:
        """The reader's next message; in a thread, as it may be large. Raises ReaderFailed at its end."""
        try:
            return await anyio.to_thread.run_sync(self._receive, abandon_on_cancel=True)
        except (EOFError, OSError) as exc:
            raise ReaderFailed(f"reader process {self.pid} ended (exit code {self.popen.poll()})") from exc

    def _receive(self) -> Any:
        with self._lock:
            if self._killed:
                raise EOFError
            self._receiving = True
        try:
            return self.conn.recv()
        finally:
            with self._lock:
                self._receiving = False
                if self._killed:
                    with contextlib.suppress(OSError):
                        self.conn.close()

    async def call(self, function: Callable[..., Any], args: tuple[Any, ...]) -> tuple[bool, Any]:
        """Send one read; its reply: ``(True, result)`` or ``(False, what it raised)``."""
        try:
            self.conn.send((function, args))
        except OSError as exc:
            raise ReaderFailed(f"reader process {self.pid} is gone: {exc}") from exc
        reply: tuple[bool, Any] = await self.receive()
        return reply

    def kill(self) -> None:
        """SIGKILL: a reader holds nothing that needs a clean end (read-only connections)."""
        with contextlib.suppress(ProcessLookupError):
            self.popen.kill()
        with self._lock:
            self._killed = True
            if not self.conn.closed:
                with contextlib.suppress(OSError):
                    _shut_down(self.conn.fileno())
                if not self._receiving:  # else the receiving thread closes it on its way out
                    with contextlib.suppress(OSError):
                        self.conn.close()
        # Closing stdin ends the reader too (its watcher sees the pipe's end).
        with contextlib.suppress(OSError):
            if self.popen.stdin is not None:
                self.popen.stdin.close()


def _shut_down(fd: int) -> None:
    """Shut the socket ``fd`` down both ways, without closing it: its reads end, at once."""
    end = socket.socket(fileno=fd)
    try:
        end.shutdown(socket.SHUT_RDWR)
    finally:
        end.detach()  # the descriptor stays open, its owner's to close


@dataclass(eq=False)
class Readers:
    """At most ``size`` reader processes of this API process, one read at a time each.

    ``preload``: modules a reader imports before it says it is ready, so that no
    read pays for them. Sized to the load: :meth:`warm` starts one reader ahead of
    the first read; another is started only when a read finds every reader busy;
    a reader idle for ``idle_seconds`` is stopped. Each holds ~50 MB PSS (LangGraph's
    checkpointer, langchain's messages and what they import; ~75 MB while it loaded LangGraph's
    graph runtime and the API's service modules: bench figure 16), so an API whose
    conversations are not being read holds none, and reads one at a time keep one. A read that
    outlasts ``timeout`` seconds (waiting for a reader included) raises
    :class:`ReadTimedOut`; a read cancelled (its client left) or timed out kills its
    reader, and the next read gets a fresh one.
    """

    size: int
    timeout: float
    preload: Sequence[str] = ()
    idle_seconds: float = 300.0
    _idle: list[_Reader] = field(default_factory=list)
    _busy: set[_Reader] = field(default_factory=set)
    _starting: int = 0
    _closed: bool = False
    # asyncio's primitives bind to the loop on first use, so these can be made here.
    _slots: asyncio.Semaphore = field(init=False)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    #: starts of spares and reaping of killed readers, in the background
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    #: the next look for readers idle longer than ``idle_seconds``
    _expiry: asyncio.TimerHandle | None = None

    def __post_init__(self) -> None:
        self._slots = asyncio.Semaphore(self.size)

    @property
    def pids(self) -> list[int]:
        """The reader processes now running (idle and busy)."""
        return [r.pid for r in [*self._idle, *self._busy] if r.alive()]

    # --- life -------------------------------------------------------------------------

    def _background(self, work: Callable[[], Any]) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(work())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def aclose(self) -> None:
        """Kill every reader; reads still in flight fail. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._expiry is not None:
            self._expiry.cancel()
        readers = [*self._idle, *self._busy]
        self._idle.clear()
        for reader in readers:
            reader.kill()
        for task in list(self._tasks):
            task.cancel()
        with anyio.CancelScope(shield=True):
            await asyncio.gather(*self._tasks, return_exceptions=True)
        # Reaped, so none is left a zombie while the API still runs.
        for reader in readers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                await anyio.to_thread.run_sync(reader.popen.wait, 5.0)
        if readers:
            log.info("readers.stopped", pids=[r.pid for r in readers])

    def _count(self) -> int:
        return len(self._idle) + len(self._busy) + self._starting

    def warm(self) -> None:
        """Start a reader in the background unless one is idle or starting, or there is no room."""
        if self._closed or self._idle or self._starting or self._count() >= self.size:
            return
        self._starting += 1
        self._background(self._start_spare)

    async def _start_spare(self) -> None:
        try:
            reader = await self._start()
        except Exception as exc:  # a spare that cannot start costs only itself
            log.warning("reader.start_failed", error=str(exc))
            return
        finally:
            self._starting -= 1
            self._notify()
        if self._closed:
            reader.kill()
            return
        self._rest(reader)
        self._notify()

    async def _start(self) -> _Reader:
        ours, theirs = socket.socketpair()
        started = time.monotonic()
        try:
            # Popen returns once the child is forked and exec'd (milliseconds); the
            # wait for the reader to be ready is below, async.
            popen = subprocess.Popen(  # noqa: ASYNC220
                [sys.executable, "-m", "api.http.reader_process", str(theirs.fileno()), str(os.getpid()),
                 *self.preload],
                stdin=subprocess.PIPE,  # the lifeline: only this process holds its writing end
                pass_fds=(theirs.fileno(),),
            )
        except OSError as exc:
            ours.close()
            raise ReaderFailed(f"a reader process could not be started: {exc}") from exc
        finally:
            theirs.close()
        reader = _Reader(popen, Connection(ours.detach()))
        try:
            with anyio.fail_after(START_SECONDS):
                ready = await reader.receive()
            if ready != READY:
                raise ReaderFailed(f"reader process {reader.pid} said {ready!r} instead of ready")
        except BaseException:
            reader.kill()
            with anyio.CancelScope(shield=True), contextlib.suppress(subprocess.TimeoutExpired):
                await anyio.to_thread.run_sync(popen.wait, 5.0)
            raise
        log.info("reader.started", pid=reader.pid, seconds=round(time.monotonic() - started, 3))
        return reader

    def _discard(self, reader: _Reader) -> None:
        """Kill ``reader`` and reap it in the background (no zombie left behind)."""
        reader.kill()
        if not self._closed:
            self._background(functools.partial(self._reap, reader))

    @staticmethod
    async def _reap(reader: _Reader) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            await anyio.to_thread.run_sync(reader.popen.wait, 5.0)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _rest(self, reader: _Reader) -> None:
        """``reader`` is idle from now: stopped after ``idle_seconds`` unless a read takes it."""
        reader.idle_since = time.monotonic()
        self._idle.append(reader)
        if self._expiry is None:
            self._expiry = asyncio.get_running_loop().call_later(self.idle_seconds, self._expire)

    def _expire(self) -> None:
        """Stop the readers idle for ``idle_seconds``; look again when the next one will be."""
        self._expiry = None
        if self._closed:
            return
        now = time.monotonic()
        expired = [r for r in self._idle if now - r.idle_since >= self.idle_seconds]
        for reader in expired:
            self._idle.remove(reader)
            self._discard(reader)
        if expired:
            log.info("readers.idle_stopped", pids=[r.pid for r in expired], idle_seconds=self.idle_seconds)
        if self._idle:
            due = min(r.idle_since for r in self._idle) + self.idle_seconds - now
            self._expiry = asyncio.get_running_loop().call_later(max(due, 0.0), self._expire)

    async def _take(self) -> _Reader:
        """A reader for one read (marked busy): an idle one, the spare on its way, or one started now."""
        while True:
            while self._idle:
                reader = self._idle.pop()
                if reader.alive():
                    self._busy.add(reader)
                    return reader
                log.warning("reader.died", pid=reader.pid, exit_code=reader.popen.poll())
                self._discard(reader)
            if self._starting == 0:
                # Every reader is busy (or there is none): the load asks for one more.
                self._starting += 1
                try:
                    reader = await self._start()
                finally:
                    self._starting -= 1
                self._busy.add(reader)
                return reader
            # A spare is on its way (sooner than a process started now): wait for it.
            await self._changed.wait()

    # --- reads ------------------------------------------------------------------------

    async def run(self, function: Callable[..., T], *args: Any, what: str) -> T:
        """``function(*args)`` in a reader, bounded by the timeout; ``what`` names the read in errors.

        ``function`` and its arguments must be picklable (a module-level function, or
        a partial of one); so must its result and whatever it raises.
        """
        if self._closed:
            raise ReaderFailed("the readers are closed (the API is stopping)")
        try:
            with anyio.fail_after(self.timeout):
                async with self._slots:
                    reader = await self._take()
                    reply: tuple[bool, Any] | None = None
                    try:
                        reply = await reader.call(function, args)
                    finally:
                        self._busy.discard(reader)
                        if reply is not None and not self._closed:
                            self._rest(reader)
                        else:
                            # Timed out, cancelled (its client left), or the reader died:
                            # whatever it is doing is of no use to anyone now.
                            if reader.alive() and not self._closed:
                                log.warning("reader.abandoned", pid=reader.pid, read=what)
                            self._discard(reader)
                            self.warm()
                        self._notify()
        except TimeoutError:
            # Given up while waiting for a reader too (the spare it waited for taken or killed):
            # one stays on its way, so the next read does not pay for a start.
            self.warm()
            raise ReadTimedOut(
                f"reading {what} took longer than {self.timeout:g} s (READ_TIMEOUT); try again later"
            ) from None
        if reply is None:  # unreachable: without a reply, the block above raised
            raise ReaderFailed(f"no reply to reading {what}")
        ok, value = reply
        if not ok:
            raise value
        result: T = value
        return result
