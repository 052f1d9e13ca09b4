"""Every request's caller, decided once, before any handler runs: the one guard of the API.

What a request presents (``Authorization: Bearer …``, ``x-api-key: …`` as the LangGraph SDKs
send, ``?access_token=`` only on the routes a browser requests by itself):

- ``API_TOKEN``: the shared operator token of before identities;
- a key made by ``sophos users add`` (``sk-sophos-…``): that user, unless revoked;
- a JWT, with ``AUTH_OIDC_ISSUER`` set: the user its claim names (api/auth/oidc.py);
- nothing, when no identity is configured (no API_TOKEN, no issuer, no user yet): the local
  user, on a loopback-only API, with the browser checks of api/auth/bearer.py.

The caller is bound for the request (api/auth/identity.py) and for its log lines. Routes
marked ``opt={"public": True}`` (healthz) need no caller; ``opt={OPERATOR_ONLY: True}``
(``/metrics``, the users) answer 403 to a user who is not an operator.
"""

from __future__ import annotations

import hmac
from typing import Any

import structlog
from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler

from api.auth.bearer import BROWSER_REQUESTED, check_browser, digest, presented_token
from api.auth.identity import LOCAL, TOKEN, Caller, bind
from api.auth.keys import KeyDirectory
from api.auth.oidc import OidcVerifier
from shared.errors import Forbidden, Unauthorized
from shared.settings import Settings
from shared.users import KEY_PREFIX

#: ``opt={OPERATOR_ONLY: True}``: a route for operators only (403 for other users)
OPERATOR_ONLY = "operator_only"


class Authenticator:
    """Turns what a request presents into its caller (or 401)."""

    def __init__(self, settings: Settings, keys: KeyDirectory, oidc: OidcVerifier | None) -> None:
        self.settings = settings
        self.keys = keys
        self.oidc = oidc
        self._token = digest(settings.api_token) if settings.api_token else None

    async def identify(self, presented: str | None) -> Caller | None:
        """The caller ``presented`` proves; None when nothing was presented and nothing needs to be."""
        configured = self.settings.auth_configured or await self.keys.in_force()
        if not configured:
            return None  # no identities: whatever was presented changes nothing, as before them
        if presented is None:
            raise Unauthorized("a bearer token is required (Authorization: Bearer, or x-api-key)")
        if self._token is not None and hmac.compare_digest(digest(presented), self._token):
            return TOKEN
        if presented.startswith(KEY_PREFIX):
            user = await self.keys.user(presented)
            if user is None:
                raise Unauthorized("the key is not valid (unknown, or revoked)")
            return Caller(user.name, operator=user.operator, how="key")
        if self.oidc is not None and presented.count(".") == 2:
            return await self.oidc.caller(presented)
        raise Unauthorized("the bearer token is not valid")


def _authenticator(connection: ASGIConnection[Any, Any, Any, Any]) -> Authenticator:
    auth: Authenticator = connection.app.state.resources.auth
    return auth


async def identify(connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler) -> None:
    """The guard every route of the API and the Agent Protocol has."""
    if handler.opt.get("public"):
        return
    query = bool(handler.opt.get(BROWSER_REQUESTED))
    presented = presented_token(connection, query=query)
    if presented is None and not query and "access_token" in connection.query_params:
        raise Unauthorized(
            "a bearer token is required in the Authorization header: access_token in the "
            "query is accepted only by the event stream and the export"
        )
    auth = _authenticator(connection)
    who = await auth.identify(presented)
    if who is None:
        check_browser(connection, auth.settings)
        who = LOCAL
    if handler.opt.get(OPERATOR_ONLY) and not who.operator:
        raise Forbidden(f"{connection.url.path} is for operators; {who.name!r} is not one")
    connection.scope["user"] = who
    bind(who)
    structlog.contextvars.bind_contextvars(user=who.name)
