"""Credentials as a request presents them, and where the API may listen without identities.

With identities configured (api/auth/guard.py), every route needs ``Authorization: Bearer
<credential>`` (or ``x-api-key``); routes marked ``opt={"public": True}`` (healthz) stay
open. Routes marked ``opt={BROWSER_REQUESTED: True}`` (the event stream, the export) also take
``?access_token=<token>``: a browser requests them by itself (EventSource, a
download link) and cannot set a header. Nowhere else: a token in a URL is kept
by browser histories and proxies' logs. No log line of ours contains a query
string (api/http/access_log.py).

Without a token, a web page in the local user's browser could still reach a
loopback API: by a cross-origin "simple" POST (no preflight; the body is read
as JSON whatever its content type) or by DNS rebinding (its own name resolving
to 127.0.0.1, making the API same-origin). :func:`browser_guard` refuses both,
except for pages of the origins listed in CORS_ORIGINS, which are let in on purpose.
With identities neither works: a browser never adds a credential by itself.
"""

from __future__ import annotations

import hashlib
import ipaddress
from typing import Any
from urllib.parse import urlsplit

from litestar.connection import ASGIConnection

from shared.errors import Forbidden
from shared.settings import Settings

#: ``opt={BROWSER_REQUESTED: True}`` marks a route that a browser requests by itself
#: (EventSource, a link): it also takes ``?access_token=``
BROWSER_REQUESTED = "browser_requested"


def presented_token(connection: ASGIConnection[Any, Any, Any, Any], *, query: bool) -> str | None:
    """The credential of the request: ``Authorization: Bearer``, else ``x-api-key`` (what the
    LangGraph SDKs send), else ``?access_token=`` when ``query``."""
    header = connection.headers.get("authorization")
    if header:
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    if key := connection.headers.get("x-api-key", "").strip():
        return key
    if not query:
        return None
    return connection.query_params.get("access_token") or None


def digest(token: str) -> bytes:
    # Comparing digests keeps the comparison's time independent of the token's
    # length too, which compare_digest on the raw values would reveal.
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses; a wildcard (0.0.0.0, ::) or any
    other name or address is reachable from elsewhere."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def exposure_problem(settings: Settings, *, keys_in_force: bool = False) -> str | None:
    """Why the API must not start with ``settings``, or None.

    Listening beyond loopback without identities would let anyone who can reach the port
    read every conversation and make the agent act: allowed only with API_TOKEN, an OIDC
    issuer or users' keys (``keys_in_force``: a user exists), or when ALLOW_UNAUTHENTICATED
    says so (e.g. a trusted network, or a proxy that authenticates).
    """
    if settings.auth_configured or keys_in_force or settings.allow_unauthenticated:
        return None
    if is_loopback(settings.api_host):
        return None
    return (
        f"API_HOST={settings.api_host} listens beyond loopback but no identity is configured: "
        "make a user (`sophos users add NAME`), set API_TOKEN or AUTH_OIDC_ISSUER, bind API_HOST "
        "to 127.0.0.1, or set ALLOW_UNAUTHENTICATED=true to serve without authentication on purpose"
    )


def _hostname(authority: str) -> str | None:
    try:
        return urlsplit(f"//{authority}").hostname
    except ValueError:
        return None


def check_browser(connection: ASGIConnection[Any, Any, Any, Any], settings: Settings) -> None:
    """Without identities: refuse cross-origin browser requests and, on loopback, foreign Host names.

    Clients that are not browsers send no ``Origin`` and a loopback ``Host``, and
    pass; so do pages of an origin in CORS_ORIGINS (their ``Host`` is still checked).
    """
    host = connection.headers.get("host", "")
    if is_loopback(settings.api_host):
        name = _hostname(host)
        if name is None or not is_loopback(name):
            raise Forbidden(
                "without identities this API answers only to loopback names "
                f"(localhost, 127.0.0.1, [::1]), not {host[:100]!r}"
            )
    origin = connection.headers.get("origin")
    if origin is None or origin in settings.cors_origins:
        return
    if origin == "null" or urlsplit(origin).netloc.lower() != host.lower():
        raise Forbidden(f"cross-origin requests are not accepted (Origin {origin[:100]!r})")
