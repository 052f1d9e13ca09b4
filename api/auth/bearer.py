"""Who may talk to the API: the optional bearer token, and where the API may listen without one.

With ``API_TOKEN`` set, every ``/api/*`` route needs ``Authorization: Bearer
<token>``; routes marked ``opt={"public": True}`` (healthz) stay open. Routes
marked ``opt={BROWSER_REQUESTED: True}`` (the event stream, the export) also take
``?access_token=<token>``: a browser requests them by itself (EventSource, a
download link) and cannot set a header. Nowhere else: a token in a URL is kept
by browser histories and proxies' logs. No log line of ours contains a query
string (api/http/access_log.py).

Without a token, a web page in the local user's browser could still reach a
loopback API: by a cross-origin "simple" POST (no preflight; the body is read
as JSON whatever its content type) or by DNS rebinding (its own name resolving
to 127.0.0.1, making the API same-origin). :func:`browser_guard` refuses both,
except for pages of the origins listed in CORS_ORIGINS, which are let in on purpose.
With a token neither works: a browser never adds the token by itself.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from typing import Any
from urllib.parse import urlsplit

from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler
from litestar.types import Guard

from shared.errors import Forbidden, Unauthorized
from shared.settings import Settings

#: ``opt={BROWSER_REQUESTED: True}`` marks a route that a browser requests by itself
#: (EventSource, a link): it also takes ``?access_token=``
BROWSER_REQUESTED = "browser_requested"


def presented_token(
    connection: ASGIConnection[Any, Any, Any, Any], *, query: bool, api_key: bool = False
) -> str | None:
    """The bearer token of the request; from ``?access_token=`` too when ``query``, and from
    ``x-api-key`` (what the LangGraph SDKs send) when ``api_key``."""
    header = connection.headers.get("authorization")
    if header:
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    if api_key and (key := connection.headers.get("x-api-key", "").strip()):
        return key
    if not query:
        return None
    return connection.query_params.get("access_token") or None


def _digest(token: str) -> bytes:
    # Comparing digests keeps the comparison's time independent of the token's
    # length too, which compare_digest on the raw values would reveal.
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


def token_guard(token: str, *, api_key: bool = False) -> Guard:
    """A Litestar guard admitting requests that present ``token`` (also as ``x-api-key`` when
    ``api_key``: the Agent Protocol's routes, api/protocol/)."""
    expected = _digest(token)

    def guard(connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler) -> None:
        if handler.opt.get("public"):
            return
        query = bool(handler.opt.get(BROWSER_REQUESTED))
        presented = presented_token(connection, query=query, api_key=api_key)
        if presented is None:
            if not query and "access_token" in connection.query_params:
                raise Unauthorized(
                    "a bearer token is required in the Authorization header: access_token in the "
                    "query is accepted only by the event stream and the export"
                )
            raise Unauthorized("a bearer token is required")
        if not hmac.compare_digest(_digest(presented), expected):
            raise Unauthorized("the bearer token is not valid")

    return guard


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses; a wildcard (0.0.0.0, ::) or any
    other name or address is reachable from elsewhere."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def exposure_problem(settings: Settings) -> str | None:
    """Why the API must not start with ``settings``, or None.

    Listening beyond loopback without a token would let anyone who can reach the
    port read every conversation and make the agent act: allowed only when
    ALLOW_UNAUTHENTICATED says so (e.g. a trusted network, or a proxy that
    authenticates).
    """
    if settings.api_token or settings.allow_unauthenticated or is_loopback(settings.api_host):
        return None
    return (
        f"API_HOST={settings.api_host} listens beyond loopback but API_TOKEN is not set: "
        "set API_TOKEN, bind API_HOST to 127.0.0.1, or set ALLOW_UNAUTHENTICATED=true "
        "to serve without authentication on purpose"
    )


def _hostname(authority: str) -> str | None:
    try:
        return urlsplit(f"//{authority}").hostname
    except ValueError:
        return None


def browser_guard(settings: Settings) -> Guard | None:
    """Without API_TOKEN: refuse cross-origin browser requests and, on loopback, foreign Host names.

    Clients that are not browsers send no ``Origin`` and a loopback ``Host``, and
    pass; so do pages of an origin in CORS_ORIGINS (their ``Host`` is still checked).
    None when a token is set.
    """
    if settings.api_token:
        return None
    check_host = is_loopback(settings.api_host)
    listed = frozenset(settings.cors_origins)

    def guard(connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler) -> None:
        host = connection.headers.get("host", "")
        if check_host:
            name = _hostname(host)
            if name is None or not is_loopback(name):
                raise Forbidden(
                    "without API_TOKEN this API answers only to loopback names "
                    f"(localhost, 127.0.0.1, [::1]), not {host[:100]!r}"
                )
        origin = connection.headers.get("origin")
        if origin is None or origin in listed:
            return
        if origin == "null" or urlsplit(origin).netloc.lower() != host.lower():
            raise Forbidden(f"cross-origin requests are not accepted (Origin {origin[:100]!r})")

    return guard
