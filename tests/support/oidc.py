"""An OpenID Connect issuer on loopback for tests: a discovery document, a JWKS that can rotate,
and tokens signed with its keys (PyJWT), or with anything a test wants to try; and, for the page's
sign-in, the authorization code flow with PKCE (S256) for a public client: ``/authorize`` signs in
``login_as`` at once (no form to fill) and ``/token`` exchanges the code, checking the verifier."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm


@dataclass
class SigningKey:
    kid: str
    private: rsa.RSAPrivateKey = field(repr=False)

    @classmethod
    def make(cls, kid: str | None = None) -> SigningKey:
        private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        return cls(kid or uuid.uuid4().hex[:12], private)

    def jwk(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(RSAAlgorithm.to_jwk(self.private.public_key()))
        return {**data, "kid": self.kid, "use": "sig", "alg": "RS256"}


class Issuer:
    """``url`` is the issuer; ``keys`` are served in its JWKS (rotate by changing the list);
    ``jwks_fetches`` counts how often the JWKS was asked for."""

    def __init__(self, audience: str = "sophos") -> None:
        self.audience = audience
        self.keys: list[SigningKey] = [SigningKey.make()]
        self.jwks_fetches = 0
        #: who signs in at ``/authorize``, and the extra claims of their access token
        self.login_as = "alice"
        self.login_claims: dict[str, Any] = {}
        #: code -> what ``/authorize`` was asked (client, redirect, challenge, nonce)
        self.codes: dict[str, dict[str, str]] = {}
        #: the token exchanges refused, with why
        self.refused: list[str] = []
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def _cors(self) -> None:
                # The page fetches discovery and the token endpoint from its own origin.
                self.send_header("Access-Control-Allow-Origin", "*")
                self.send_header("Access-Control-Allow-Headers", "*")

            def do_OPTIONS(self) -> None:
                self.send_response(204)
                self._cors()
                self.end_headers()

            def do_POST(self) -> None:
                if urlsplit(self.path).path != "/token":
                    self.send_error(404)
                    return
                form = {k: v[0] for k, v in parse_qs(
                    self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()).items()}
                status, body = issuer.exchange(form)
                raw = json.dumps(body).encode()
                self.send_response(status)
                self._cors()
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self) -> None:
                body: dict[str, Any]
                if self.path.startswith("/authorize?"):
                    self.send_response(302)
                    self.send_header("Location", issuer.authorize(
                        {k: v[0] for k, v in parse_qs(urlsplit(self.path).query).items()}))
                    self.end_headers()
                    return
                if self.path == "/.well-known/openid-configuration":
                    body = {"issuer": issuer.url, "jwks_uri": f"{issuer.url}/jwks",
                            "authorization_endpoint": f"{issuer.url}/authorize",
                            "token_endpoint": f"{issuer.url}/token",
                            "response_types_supported": ["code"],
                            "code_challenge_methods_supported": ["S256"]}
                elif self.path == "/jwks":
                    issuer.jwks_fetches += 1
                    body = {"keys": [k.jwk() for k in issuer.keys]}
                else:
                    self.send_error(404)
                    return
                raw = json.dumps(body).encode()
                self.send_response(200)
                self._cors()
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    def __enter__(self) -> Issuer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def claims(self, sub: str, **extra: Any) -> dict[str, Any]:
        now = int(time.time())
        return {"iss": self.url, "aud": self.audience, "sub": sub, "iat": now, "exp": now + 300, **extra}

    def token(self, sub: str, *, key: SigningKey | None = None, **extra: Any) -> str:
        key = key or self.keys[0]
        return jwt.encode(self.claims(sub, **extra), key.private, algorithm="RS256", headers={"kid": key.kid})

    def authorize(self, asked: dict[str, str]) -> str:
        """Where ``/authorize`` sends the browser back: ``login_as`` signed in, with a code."""
        code = secrets.token_urlsafe(16)
        self.codes[code] = asked
        answer = {"code": code, "state": asked.get("state", "")}
        return f"{asked['redirect_uri']}?{urlencode(answer)}"

    def exchange(self, form: dict[str, str]) -> tuple[int, dict[str, Any]]:
        """``/token``: the code once, for its client and redirect, with the PKCE verifier."""
        asked = self.codes.pop(form.get("code", ""), None)
        problem = None
        if asked is None:
            problem = "unknown or used code"
        elif form.get("grant_type") != "authorization_code":
            problem = "not an authorization code grant"
        elif any(form.get(name) != asked.get(name) for name in ("client_id", "redirect_uri")):
            problem = "another client or redirect"
        elif asked.get("code_challenge_method") != "S256" or (
            _s256(form.get("code_verifier", "")) != asked.get("code_challenge")
        ):
            problem = "the PKCE verifier does not match"
        if problem is not None or asked is None:
            self.refused.append(problem or "")
            return 400, {"error": "invalid_grant", "error_description": problem}
        id_claims = {**self.claims(self.login_as), "aud": asked["client_id"]}
        if "nonce" in asked:
            id_claims["nonce"] = asked["nonce"]
        key = self.keys[0]
        return 200, {
            "access_token": self.token(self.login_as, **self.login_claims),
            "id_token": jwt.encode(id_claims, key.private, algorithm="RS256", headers={"kid": key.kid}),
            "token_type": "Bearer",
            "expires_in": 300,
            "scope": asked.get("scope", "openid"),
        }


def _s256(verifier: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
