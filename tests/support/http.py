"""httpx clients for the tests: loopback, no proxy or certificate settings from the environment,
and one TLS context for all of them.

httpx builds a TLS context for every client it makes, loading the CA bundle even for an
``http://`` URL: 15 to 30 ms of CPU a client. The suite makes tens of thousands (each helper call
and each poll of a readiness loop opens its own), and its real-process tier is CPU-bound on two
cores: py-spy found the test processes spending up to a quarter of their time there.
"""

from __future__ import annotations

import functools
import ssl
from typing import Any

import httpx


@functools.cache
def tls() -> ssl.SSLContext:
    """The one TLS context (the default one: certificates verified)."""
    return ssl.create_default_context()


def http_client(*args: Any, **options: Any) -> httpx.Client:
    """``httpx.Client(...)`` with ``trust_env=False`` and the shared TLS context unless given."""
    options.setdefault("trust_env", False)
    options.setdefault("verify", tls())
    return httpx.Client(*args, **options)


def async_http_client(*args: Any, **options: Any) -> httpx.AsyncClient:
    """``httpx.AsyncClient(...)``, likewise."""
    options.setdefault("trust_env", False)
    options.setdefault("verify", tls())
    return httpx.AsyncClient(*args, **options)
