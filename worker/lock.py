"""The single-writer lock: one worker per database file."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class WorkerLockHeld(RuntimeError):
    pass


class WriterLock:
    """An exclusive ``flock`` on ``<database>.lock``, held for the worker's life.

    The kernel drops it when the process dies, SIGKILL included, so a crashed
    worker never leaves a stale lock behind.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise WorkerLockHeld(
                f"another worker (pid {holder}) holds {self.path}; only one worker may write the database"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
