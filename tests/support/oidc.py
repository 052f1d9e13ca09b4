"""An OpenID Connect issuer on loopback for tests: a discovery document, a JWKS that can rotate,
and tokens signed with its keys (PyJWT), or with anything a test wants to try."""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

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
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body: dict[str, Any]
                if self.path == "/.well-known/openid-configuration":
                    body = {"issuer": issuer.url, "jwks_uri": f"{issuer.url}/jwks",
                            "authorization_endpoint": f"{issuer.url}/authorize",
                            "token_endpoint": f"{issuer.url}/token"}
                elif self.path == "/jwks":
                    issuer.jwks_fetches += 1
                    body = {"keys": [k.jwk() for k in issuer.keys]}
                else:
                    self.send_error(404)
                    return
                raw = json.dumps(body).encode()
                self.send_response(200)
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
