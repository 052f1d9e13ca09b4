"""OpenID Connect bearer tokens: a JWT signed by the issuer's keys is the user it names.

The issuer's discovery document (``AUTH_OIDC_ISSUER/.well-known/openid-configuration``) names
its JWKS; the keys are kept and fetched again when a token names a key id they lack (the
issuer rotated its keys), at most once a minute, so a flood of tokens with made-up key ids
cannot make the API hammer the issuer. Verifying is PyJWT's (signature, ``exp``, ``nbf``,
``iss``, ``aud``), never ours: only asymmetric algorithms are accepted, and each key only
with its own, so ``alg: none`` and an HMAC "signed" with the public key are refused.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
import jwt
import structlog

from api.auth.identity import Caller
from shared.errors import Unauthorized
from shared.settings import Settings

log = structlog.get_logger(__name__)

#: the signatures an issuer's public keys make; never HS* (a shared secret) nor none
ASYMMETRIC = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
#: at most one fetch of the keys per this many seconds when a token names an unknown key
REFETCH_SECONDS = 60.0
#: while no key could be fetched yet, asked again at most this often
RETRY_SECONDS = 5.0
#: clock difference tolerated between the issuer and us on ``exp`` and ``nbf``
LEEWAY_SECONDS = 30
FETCH_TIMEOUT = 5.0
#: what each key type signs with, for a key whose JWK declares no ``alg``
FAMILY = {
    "RSA": ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512"),
    "EC": ("ES256", "ES384", "ES512"),
    "OKP": ("EdDSA",),
}


class _Key:
    """An issuer's public key and the algorithms it may verify."""

    def __init__(self, jwk: jwt.PyJWK, data: dict[str, Any]) -> None:
        self.key = jwk.key
        declared = data.get("alg")
        self.algorithms = (declared,) if declared else FAMILY.get(str(data.get("kty")), ())


class OidcVerifier:
    def __init__(self, settings: Settings, http: Callable[[], httpx.AsyncClient]) -> None:
        if settings.auth_oidc_issuer is None or settings.auth_oidc_audience is None:
            raise ValueError("AUTH_OIDC_ISSUER and AUTH_OIDC_AUDIENCE are needed")
        self.issuer = settings.auth_oidc_issuer
        self.audience = settings.auth_oidc_audience
        self.user_claim = settings.auth_oidc_user_claim
        self.operator_claim = settings.auth_oidc_operator_claim
        self.operator_value = settings.auth_oidc_operator_value
        self.http = http
        self._keys: dict[str, _Key] = {}
        self._attempted_at: float | None = None
        self._refetched_at: float | None = None
        self._lock = asyncio.Lock()

    async def caller(self, token: str) -> Caller:
        """The user ``token`` names, or Unauthorized saying why not."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise Unauthorized(f"the bearer token is not a valid JWT ({exc})") from None
        alg = header.get("alg")
        if alg not in ASYMMETRIC:
            raise Unauthorized(
                f"the token's algorithm {str(alg)[:20]!r} is not accepted (only {', '.join(ASYMMETRIC)})"
            )
        key = await self._key(header.get("kid"))
        if alg not in key.algorithms:
            raise Unauthorized(f"the token's algorithm {alg} is not its key's ({', '.join(key.algorithms)})")
        try:
            claims: dict[str, Any] = jwt.decode(
                token, key=key.key, algorithms=[alg], audience=self.audience,
                issuer=self.issuer, leeway=LEEWAY_SECONDS,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.ExpiredSignatureError:
            raise Unauthorized("the bearer token has expired") from None
        except jwt.PyJWTError as exc:
            raise Unauthorized(f"the bearer token is not valid: {exc}") from None
        name = claims.get(self.user_claim)
        if not isinstance(name, str) or not name:
            raise Unauthorized(f"the token has no {self.user_claim!r} claim naming its user")
        return Caller(name, operator=self._is_operator(claims), how="oidc")

    def _is_operator(self, claims: dict[str, Any]) -> bool:
        if self.operator_claim is None:
            return False
        value = claims.get(self.operator_claim)
        if isinstance(value, list):
            return self.operator_value in value
        return value == self.operator_value

    async def _key(self, kid: str | None) -> _Key:
        found = self._pick(kid)
        if found is not None:
            return found
        async with self._lock:
            found = self._pick(kid)
            if found is None and self._may_fetch():
                await self._fetch()
                found = self._pick(kid)
        if found is None:
            raise Unauthorized("the token was not signed by a key of the issuer")
        return found

    def _may_fetch(self) -> bool:
        """Keys are fetched when none are known (again every :data:`RETRY_SECONDS` while the
        issuer does not answer), and again for a key id they lack at most once a minute."""
        now = time.monotonic()
        if not self._keys:
            due = self._attempted_at is None or now - self._attempted_at >= RETRY_SECONDS
        else:
            due = self._refetched_at is None or now - self._refetched_at >= REFETCH_SECONDS
            if due:
                self._refetched_at = now
        return due

    def _pick(self, kid: str | None) -> _Key | None:
        if kid is not None:
            return self._keys.get(kid)
        # A token without a key id is taken only from an issuer with one key.
        return next(iter(self._keys.values())) if len(self._keys) == 1 else None

    async def _fetch(self) -> None:
        self._attempted_at = time.monotonic()
        try:
            discovery = await self._get_json(f"{self.issuer}/.well-known/openid-configuration")
            if str(discovery.get("issuer", "")).rstrip("/") != self.issuer:
                raise ValueError(f"the discovery document names issuer {discovery.get('issuer')!r}")
            jwks = await self._get_json(str(discovery["jwks_uri"]))
            keys: dict[str, _Key] = {}
            for i, data in enumerate(jwks.get("keys", [])):
                if data.get("use", "sig") != "sig":
                    continue
                try:
                    key = jwt.PyJWK.from_dict(data)
                except jwt.PyJWTError:
                    continue  # a key type or algorithm we do not take (an HMAC secret, say)
                if key.algorithm_name in ASYMMETRIC:
                    keys[str(data.get("kid", i))] = _Key(key, data)
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            log.warning("oidc.keys_unavailable", issuer=self.issuer, error=str(exc)[:200])
            return  # keep the keys we had: a token they verify still passes
        self._keys = keys
        log.info("oidc.keys_fetched", issuer=self.issuer, keys=len(keys))

    async def _get_json(self, url: str) -> dict[str, Any]:
        answer = await self.http().get(url, timeout=FETCH_TIMEOUT, follow_redirects=False)
        answer.raise_for_status()
        data = answer.json()
        if not isinstance(data, dict):
            raise ValueError(f"{url} answered {type(data).__name__}, not a JSON object")
        return data
