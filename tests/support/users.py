"""``sophos users`` as an operator types it, for the tests of identities: no service needs to run
(it writes the database the environment names)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping


def users(env: Mapping[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``sophos users ARGS``, whatever its exit."""
    return subprocess.run(
        [sys.executable, "-m", "sophos_cli", "users", *args], env=dict(env), capture_output=True, text=True,
        timeout=60, check=False,
    )


def add_user(env: Mapping[str, str], name: str, *flags: str) -> str:
    """Make ``name`` a user (``--operator``: an operator); its key, the last line, printed once."""
    made = users(env, "add", name, *flags)
    assert made.returncode == 0, made.stderr
    return made.stdout.strip().splitlines()[-1]
