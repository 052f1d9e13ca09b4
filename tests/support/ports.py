"""Ports for the servers a test starts: each pytest process walks a block of its own.

``bind(("127.0.0.1", 0))`` hands out ports from the kernel's ephemeral range, the same
range every outgoing connection's source port comes from: a Redis stopped for a
restart can find its port taken by some client's connection, and two xdist workers
asking at the same moment can be given the same port. So ports come from below the
ephemeral range instead (``PORT_RANGE``), in one block per xdist worker (``gw0``,
``gw1``, …; a run without xdist uses block 0), walked from a random start and never
handed out twice by one process. Each is checked free by binding it first; what is
left is another test run on this machine choosing the same port in the same instant.
"""

from __future__ import annotations

import os
import random
import socket
import threading

#: Below Linux's default ephemeral range (32768-60999) and above the usual services'
#: ports (PostgreSQL 5432, Redis 6379, 8000-range development servers).
PORT_RANGE = (15000, 32000)
BLOCK_SIZE = 1000
_BLOCKS = (PORT_RANGE[1] - PORT_RANGE[0]) // BLOCK_SIZE


def _block_index() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw3" in an xdist worker
    digits = worker.removeprefix("gw")
    return int(digits) % _BLOCKS if digits.isdigit() else 0


class _Ports:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._next = 0
        self._given: set[int] = set()

    def _start(self) -> None:
        # Per process (a fork starts over with a fresh random start in its block).
        self._pid = os.getpid()
        self._next = random.randrange(BLOCK_SIZE)  # noqa: S311 - spreading, not a secret
        self._given = set()

    def take(self) -> int:
        with self._lock:
            if self._pid != os.getpid():
                self._start()
            base = PORT_RANGE[0] + _block_index() * BLOCK_SIZE
            for _ in range(BLOCK_SIZE):
                port = base + self._next % BLOCK_SIZE
                self._next += 1
                if port in self._given and len(self._given) < BLOCK_SIZE // 2:
                    continue
                if _bindable(port):
                    self._given.add(port)
                    return port
        return _ephemeral()  # the whole block busy: the kernel's choice, as before


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ephemeral() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_PORTS = _Ports()


def free_port() -> int:
    """A TCP port on 127.0.0.1, free a moment ago, from this process's block of ports.

    Not handed out again by this process (until half its block is used), so a server
    stopped and started again on its port keeps it to itself.
    """
    return _PORTS.take()
