"""A reader process's side (api/http/readers.py starts it): answer reads until the API is gone.

Its own module, importing only the standard library, so that a reader loads what its reads
need and nothing of the API's (``python -m api.http.readers`` loaded anyio, structlog and what
they import, ~10 MB a reader: bench figure 16). What a read needs comes with it: the functions
it is sent are unpickled by reference, which imports their modules, and the modules named to
preload are imported before the reader says it is ready.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
import signal
import sys
import threading
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

#: Sent by a reader once it has imported what it reads with.
READY = "ready"

_PR_SET_PDEATHSIG = 1


def _end_with_parent(parent: int) -> None:
    """Exit as soon as the API is gone, whatever ended it."""
    if sys.platform == "linux":
        # Immediate, even while a read holds the GIL. It fires when the thread that
        # started us ends, but the API starts readers from its event loop's thread.
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)

    def watch() -> None:
        # stdin is the API's pipe: its end (EOF) means the API closed it or died.
        with contextlib.suppress(OSError):
            while os.read(0, 4096):
                pass
        os._exit(0)

    if os.getppid() != parent:  # died before the signal was set
        os._exit(0)
    threading.Thread(target=watch, name="lifeline", daemon=True).start()


def serve(fd: int, parent: int, preload: Sequence[str]) -> None:
    """A reader's life: say ready, then answer reads until the API closes the socket."""
    # Ctrl-C in a terminal reaches the whole process group: the API stops its readers itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _end_with_parent(parent)
    for module in preload:
        importlib.import_module(module)
    conn = Connection(fd)
    conn.send(READY)
    while True:
        try:
            function, args = conn.recv()
        except EOFError:
            return
        try:
            reply: tuple[bool, Any] = (True, function(*args))
        except Exception as exc:
            reply = (False, exc)
        try:
            conn.send(reply)
        except Exception as exc:  # not picklable
            conn.send((False, RuntimeError(f"a reader's answer could not be sent: {exc!r}")))


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:])
