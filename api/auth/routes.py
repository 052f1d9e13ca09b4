"""``GET /api/whoami``: the caller, as the guard decided it (the page and ``sophos whoami``)."""

from __future__ import annotations

import msgspec
from litestar import get

from api.auth.identity import caller
from api.http.openapi import errors


class WhoAmI(msgspec.Struct):
    name: str
    operator: bool
    #: how the caller proved it: local (no identities), token (API_TOKEN), key, oidc
    via: str


@get("/whoami", tags=["operations"], summary="Who this request's credential is", responses=errors(401))
async def whoami() -> WhoAmI:
    who = caller()
    return WhoAmI(name=who.name, operator=who.operator, via=who.how)
