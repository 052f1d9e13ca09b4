"""``GET /api/whoami``: the caller, as the guard decided it (the page and ``sophos whoami``);
``GET /api/signin``: how the page may sign in (public: it is asked before anyone has)."""

from __future__ import annotations

import msgspec
from litestar import get

from api.auth.identity import caller
from api.http.openapi import errors
from api.resources import Resources


class WhoAmI(msgspec.Struct):
    name: str
    operator: bool
    #: how the caller proved it: local (no identities), token (API_TOKEN), key, oidc
    via: str


@get("/whoami", tags=["operations"], summary="Who this request's credential is", responses=errors(401))
async def whoami() -> WhoAmI:
    who = caller()
    return WhoAmI(name=who.name, operator=who.operator, via=who.how)


class PageProvider(msgspec.Struct, rename="camel"):
    """The OpenID Connect provider the page signs in through, as a public client with PKCE."""

    issuer: str
    client_id: str
    scope: str


class SignIn(msgspec.Struct, omit_defaults=True):
    #: absent: the page signs in with a key only
    oidc: PageProvider | None = None


@get("/signin", tags=["operations"], summary="How the page may sign in: a key, or the OIDC provider",
     opt={"public": True})
async def signin(resources: Resources) -> SignIn:
    settings = resources.settings
    if settings.auth_oidc_issuer is None or settings.auth_oidc_page_client is None:
        return SignIn()
    return SignIn(oidc=PageProvider(settings.auth_oidc_issuer, settings.auth_oidc_page_client,
                                    settings.auth_oidc_page_scope))
