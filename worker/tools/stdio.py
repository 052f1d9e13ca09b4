"""A stdio MCP session whose server's stderr becomes log events, not raw lines in our log.

A stdio server inherits the worker's stderr unless told otherwise, so whatever it prints
(``Knowledge Graph MCP Server running on stdio``, a Python traceback, npm's notices)
would land between our JSON lines. mcp's ``stdio_client`` takes the file the child's
stderr goes to (``errlog``); langchain-mcp-adapters' ``create_session`` does not pass
one, so the session is opened here with mcp's own client, the same way it does.
"""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import IO, Any, TextIO

import structlog
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

log = structlog.get_logger(__name__)

#: Longer lines are cut: a server must not be able to make one log line of any size.
MAX_LINE_CHARS = 4000


class StderrRelay:
    """A pipe for one server process's stderr; a thread logs each line as ``mcp.stderr``.

    A thread rather than a task: the pipe is read with blocking reads, and the lines
    keep coming while the event loop is busy. It starts with an empty context, so a
    server's line never carries the run_id of whatever run the worker had bound.
    """

    def __init__(self, server: str) -> None:
        self.server = server
        read_fd, write_fd = os.pipe()  # both ends non-inheritable; the child gets a dup of ours
        self.file: TextIO = os.fdopen(write_fd, "w")
        reader = os.fdopen(read_fd, "rb")
        self._thread = threading.Thread(
            target=self._relay, args=(reader,), name=f"mcp-stderr:{server}", daemon=True
        )
        self._thread.start()

    def _relay(self, reader: IO[bytes]) -> None:
        with reader:
            for raw in reader:  # ends at EOF: our end closed and the server (with its children) gone
                line = raw.decode("utf-8", "replace").rstrip()
                if line:
                    log.info("mcp.stderr", server=self.server, line=line[:MAX_LINE_CHARS])

    def close(self) -> None:
        """Close our copy of the write end; the thread ends once the server's is closed too."""
        self.file.close()


@asynccontextmanager
async def open_stdio_session(name: str, connection: dict[str, Any]) -> AsyncIterator[ClientSession]:
    """A session to the stdio server of ``connection`` (see ``load_config``), not initialized."""
    params = StdioServerParameters(
        command=connection["command"],
        args=connection.get("args", []),
        env=connection.get("env"),
        cwd=connection.get("cwd"),
    )
    relay = StderrRelay(name)
    try:
        async with (
            stdio_client(params, errlog=relay.file) as (read, write),
            ClientSession(read, write) as session,
        ):
            yield session
    except (FileNotFoundError, PermissionError) as exc:
        if exc.filename is not None:
            raise
        # uvloop's spawn leaves the command out of the error, asyncio's names it: name it
        # either way, so the server's status says what could not be started.
        raise type(exc)(exc.errno, exc.strerror, params.command) from exc
    finally:
        relay.close()
