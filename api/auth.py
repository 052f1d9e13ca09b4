"""Optional bearer token on /api/*: ``Authorization: Bearer <token>`` or ``?access_token=``.

The query form exists for EventSource, which cannot set headers. Routes marked
``opt={"public": True}`` (healthz) are open.
"""

from __future__ import annotations

import hmac
from typing import Any

from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler
from litestar.types import Guard

from shared.errors import Unauthorized


def presented_token(connection: ASGIConnection[Any, Any, Any, Any]) -> str | None:
    header = connection.headers.get("authorization")
    if header:
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    return connection.query_params.get("access_token") or None


def token_guard(token: str) -> Guard:
    """A Litestar guard admitting requests that present ``token``."""
    expected = token.encode()

    def guard(connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler) -> None:
        if handler.opt.get("public"):
            return
        presented = presented_token(connection)
        if presented is None:
            raise Unauthorized("a bearer token is required")
        if not hmac.compare_digest(presented.encode(), expected):
            raise Unauthorized("the bearer token is not valid")

    return guard
