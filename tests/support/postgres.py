"""The machine's PostgreSQL for tests: a fresh database per test, all dropped at the session's end.

``SOPHOS_TEST_POSTGRES`` (default ``postgresql://postgres@127.0.0.1:5432/postgres``) names the
server's admin database; tests that need PostgreSQL are skipped, saying why, where none answers.
"""

from __future__ import annotations

import os
import uuid
from urllib.parse import urlparse, urlunparse

import psycopg
import pytest

ADMIN_URL = os.environ.get("SOPHOS_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")


class PostgresServer:
    def __init__(self, admin_url: str = ADMIN_URL) -> None:
        self.admin_url = admin_url
        self.prefix = f"sophos_test_{uuid.uuid4().hex[:8]}"
        self.created: list[str] = []

    def unreachable(self) -> str | None:
        """Why the server cannot be used, or None."""
        try:
            with psycopg.connect(self.admin_url, connect_timeout=3):
                return None
        except psycopg.Error as exc:
            return f"no PostgreSQL at {self.admin_url} ({type(exc).__name__}: {exc})".strip()

    def create_database(self) -> str:
        """A new, empty database; its URL."""
        name = f"{self.prefix}_{len(self.created)}"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        self.created.append(name)
        return urlunparse(urlparse(self.admin_url)._replace(path=f"/{name}"))

    def drop_all(self) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            for name in self.created:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.created.clear()


def engine_overrides(
    request: pytest.FixtureRequest, engine: str, *, short_lease: bool = True
) -> dict[str, str]:
    """What a stack's environment changes to run on ``engine`` (``"sqlite"``: nothing): on
    ``"postgresql"`` a new database of the session's server (``postgres_server``, skipped where
    none answers) and, with ``short_lease``, a run lease of 3 s, so a dead worker's run is taken
    over within seconds."""
    if engine != "postgresql":
        return {}
    overrides = {"DATABASE_URL": request.getfixturevalue("postgres_server").create_database()}
    if short_lease:
        overrides["RUN_LEASE_SECONDS"] = "3"
    return overrides
