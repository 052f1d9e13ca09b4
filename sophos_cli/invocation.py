"""The command the user ran, so the commands the client prints can be typed as printed.

A hint (``resume it with: … chat --resume --conversation ID``, ``decide with: … approve ID``)
names the program as it was started: ``./sophos`` (the checkout's launcher says so in
``SOPHOS_PROGRAM``), the ``sophos`` console script (by that name when it is the one on
``PATH``, else by its path), or ``python -m sophos_cli``; and it keeps the ``--url`` and
``--token`` given on the command line (variables such as ``SOPHOS_URL`` apply again by
themselves). :func:`sophos_cli.commands.main` decides it once per process; it is kept in a
context variable because hints are worded deep in the commands, and it is the same for
all of them.
"""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass

#: set by ./sophos for the client commands it starts: the launcher's path as the user typed it
PROGRAM_VARIABLE = "SOPHOS_PROGRAM"


@dataclass(frozen=True, slots=True)
class Invocation:
    #: the program, ready for a shell (``./sophos``, ``sophos``, ``.venv/bin/python -m sophos_cli``)
    program: str = "sophos"
    #: ``--url URL`` and ``--token TOKEN`` as given on the command line
    options: tuple[str, ...] = ()

    def command(self, *words: str) -> str:
        """``words`` (a command and its arguments) as the user would type them again."""
        return " ".join([self.program, shlex.join([*words, *self.options])])


def program_of(argv0: str, orig_argv: Sequence[str], env: Mapping[str, str], on_path: str | None) -> str:
    """How the user started this client. ``argv0``: ``sys.argv[0]``; ``orig_argv``:
    ``sys.orig_argv`` (the interpreter's command line as typed); ``on_path``: where ``sophos``
    is found on ``PATH`` (``shutil.which``)."""
    if env.get(PROGRAM_VARIABLE):
        return shlex.quote(env[PROGRAM_VARIABLE])
    if os.path.basename(argv0) in ("__main__.py", "-m"):  # python -m sophos_cli
        python = orig_argv[0] if orig_argv else "python3"
        return shlex.join([python, "-m", "sophos_cli"])
    if on_path is not None and os.path.basename(argv0) == "sophos":
        try:
            if os.path.samefile(on_path, argv0):
                return "sophos"
        except OSError:
            pass
    return shlex.quote(argv0) if argv0 else "sophos"


def options_of(url: str | None, token: str | None) -> tuple[str, ...]:
    """The connection options given on the command line, to be given again."""
    return (*(("--url", url) if url else ()), *(("--token", token) if token else ()))


def which_sophos() -> str | None:
    return shutil.which("sophos")


_current: ContextVar[Invocation | None] = ContextVar("invocation", default=None)


def use(invocation: Invocation) -> None:
    _current.set(invocation)


def command(*words: str) -> str:
    """``words`` as a command line of the client the user ran (see :class:`Invocation`)."""
    return (_current.get() or Invocation()).command(*words)
