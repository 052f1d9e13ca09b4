"""Identities (DESIGN.md "People and what they may touch"): users' keys, OpenID Connect bearer
JWTs, API_TOKEN as an operator, the local user when none is configured.

Real processes: ``sophos users`` writes the database itself, real APIs read it (two of them
for revocation), a real issuer on loopback serves its discovery document and JWKS
(tests/support/oidc.py) and the tokens are signed by PyJWT with real RSA keys. The tests that only
present tokens share one issuer and one API (started once for the module); the one that rotates keys
has its own.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import shutil
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives import serialization

from tests.fakes.ollama import FakeOllama
from tests.support.client import wait_for
from tests.support.env import SophosEnv, make_sophos_env
from tests.support.oidc import Issuer, SigningKey
from tests.support.ports import free_port
from tests.support.procs import ProcessGroup, ServiceProcess
from tests.support.redis_server import RedisServer
from tests.support.users import add_user, users


def whoami(url: str, credential: str | None = None, *, header: str = "authorization") -> httpx.Response:
    headers = {}
    if credential is not None:
        headers[header] = f"Bearer {credential}" if header == "authorization" else credential
    return httpx.get(f"{url}/api/whoami", headers=headers, timeout=10)


def error_code(response: httpx.Response) -> str:
    return str(response.json()["error"]["code"])


def test_a_key_is_shown_once_and_only_its_digest_is_kept(sophos_env: SophosEnv) -> None:
    key = add_user(sophos_env, "alice")
    assert key.startswith("sk-sophos-") and len(key) > 40
    stored = sophos_env.database_path.read_bytes() + b"".join(
        p.read_bytes() for p in sophos_env.database_path.parent.glob("*-wal")
    )
    assert key.encode() not in stored
    with sqlite3.connect(sophos_env.database_path) as conn:
        (digest,) = conn.execute("SELECT key_digest FROM users WHERE name = 'alice'").fetchone()
    assert digest == hashlib.sha256(key.encode()).hexdigest()

    listed = users(sophos_env, "list")
    assert listed.returncode == 0 and "alice\tuser\tactive" in listed.stdout
    assert key not in listed.stdout
    again = users(sophos_env, "add", "alice")
    assert again.returncode == 1 and "USER_EXISTS" in again.stderr
    reserved = users(sophos_env, "add", "local")
    assert reserved.returncode == 1 and "reserved" in reserved.stderr


def test_keys_are_in_force_once_a_user_exists_and_a_revoked_key_fails_on_every_api(
    sophos_env: SophosEnv, start_api: Callable[..., ServiceProcess]
) -> None:
    first = start_api(sophos_env)
    # Before any user: the local user, an operator, as before identities.
    assert whoami(first.url).json() == {"name": "local", "operator": True, "via": "local"}
    # A stray credential (a key of another service, an old SOPHOS_TOKEN) changes nothing then.
    assert whoami(first.url, "sk-sophos-" + "x" * 43).json()["name"] == "local"

    alice = add_user(sophos_env, "alice")
    root = add_user(sophos_env, "root", "--operator")
    wait_for(lambda: whoami(first.url).status_code == 401, timeout=10, message="keys in force")
    second = start_api(sophos_env)
    apis = [first.url, second.url]
    for url in apis:
        assert whoami(url, alice).json() == {"name": "alice", "operator": False, "via": "key"}
        assert whoami(url, alice, header="x-api-key").json()["name"] == "alice"  # the SDKs' header
        assert whoami(url, root).json()["operator"] is True
        refused = whoami(url)
        assert refused.status_code == 401 and error_code(refused) == "UNAUTHORIZED"
        assert "bearer token is required" in refused.json()["error"]["message"]

    # /metrics is an operator's: a user is told so (403), an operator reads it.
    metrics = httpx.get(f"{first.url}/metrics", headers={"authorization": f"Bearer {alice}"}, timeout=10)
    assert metrics.status_code == 403 and error_code(metrics) == "FORBIDDEN"
    assert httpx.get(f"{first.url}/metrics", headers={"authorization": f"Bearer {root}"}).status_code == 200
    # So is pruning the checkpoints (api/ops/pruning.py): refused before anything is enqueued.
    as_alice = {"authorization": f"Bearer {alice}"}
    prune = httpx.post(f"{first.url}/api/checkpoints/prune", headers=as_alice, timeout=10)
    assert prune.status_code == 403 and error_code(prune) == "FORBIDDEN"

    # A key in the query is taken only where a browser must (the stream, the export).
    in_query = httpx.get(f"{first.url}/api/conversations", params={"access_token": alice}, timeout=10)
    assert in_query.status_code == 401 and "Authorization header" in in_query.json()["error"]["message"]

    unknown = whoami(first.url, "sk-sophos-" + "x" * 43)
    assert unknown.status_code == 401 and "unknown, or revoked" in unknown.json()["error"]["message"]

    revoked = users(sophos_env, "revoke", "alice")
    assert revoked.returncode == 0, revoked.stderr
    started = time.monotonic()
    wait_for(lambda: all(whoami(url, alice).status_code == 401 for url in apis), timeout=5,
             message="the revoked key refused by both APIs")
    # Each API remembers a key's answer for half a second (api/auth/keys.py): within a second.
    print(f"revocation seen by both APIs after {time.monotonic() - started:.3f} s")
    assert all(whoami(url, root).status_code == 200 for url in apis)
    assert "alice\tuser\trevoked" in users(sophos_env, "list").stdout
    # Revoking every key does not open the API; a revoked user can be given a new key.
    assert users(sophos_env, "revoke", "root").returncode == 0
    wait_for(lambda: whoami(first.url, root).status_code == 401, timeout=5, message="root revoked")
    assert whoami(first.url).status_code == 401
    alice_again = add_user(sophos_env, "alice")
    assert alice_again != alice
    wait_for(lambda: whoami(first.url, alice_again).status_code == 200, timeout=5, message="a new key")
    assert whoami(first.url, alice).status_code == 401


def test_api_token_is_an_operator(sophos_env: SophosEnv, start_api: Callable[..., ServiceProcess]) -> None:
    api = start_api(sophos_env.with_(API_TOKEN="shared-secret"))
    assert whoami(api.url, "shared-secret").json() == {"name": "api-token", "operator": True, "via": "token"}
    assert whoami(api.url, "other").status_code == 401
    assert whoami(api.url).status_code == 401


def test_an_api_beyond_loopback_starts_once_a_user_exists(
    sophos_env: SophosEnv, start_api: Callable[..., ServiceProcess]
) -> None:
    exposed = sophos_env.with_(API_HOST="0.0.0.0")
    refused = subprocess.run([sys.executable, "-m", "api"], env=exposed, capture_output=True, text=True,
                             timeout=60, check=False)
    assert refused.returncode == 2 and "sophos users add" in refused.stderr
    key = add_user(sophos_env, "alice")
    api = start_api(exposed)
    assert whoami(api.url.replace("0.0.0.0", "127.0.0.1"), key).json()["name"] == "alice"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unsigned(header: dict[str, Any], claims: dict[str, Any]) -> str:
    return f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"


def _oidc(env: SophosEnv, issuer: Issuer) -> SophosEnv:
    return env.with_(
        AUTH_OIDC_ISSUER=issuer.url, AUTH_OIDC_AUDIENCE="sophos",
        AUTH_OIDC_OPERATOR_CLAIM="groups", AUTH_OIDC_OPERATOR_VALUE="sophos-operators",
    )


@pytest.fixture(scope="module")
def shared_issuer() -> Iterator[Issuer]:
    """The issuer of the tests that only present tokens (its keys never change)."""
    with Issuer(audience="sophos") as idp:
        yield idp


@pytest.fixture(scope="module")
def shared_oidc_api(
    tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer, fake_ollama: FakeOllama,
    shared_issuer: Issuer,
) -> Iterator[str]:
    """One API trusting :func:`shared_issuer`, for the module's tests that only present tokens: each
    asks ``/api/whoami`` and changes nothing, so one API start serves them all."""
    root = tmp_path_factory.mktemp("oidc")
    env = make_sophos_env(root, redis_url=redis_server.url, ollama_url=fake_ollama.url, api_port=free_port())
    group = ProcessGroup(log_dir=root / "logs", cwd=root)
    try:
        yield group.start_api(_oidc(env, shared_issuer)).url
    finally:
        group.close()


@pytest.fixture
def issuer() -> Iterator[Issuer]:
    """An issuer of the test's own (the test rotates its keys)."""
    with Issuer(audience="sophos") as idp:
        yield idp


@pytest.fixture
def oidc_api(sophos_env: SophosEnv, issuer: Issuer, start_api: Callable[..., ServiceProcess]) -> str:
    """An API of the test's own trusting :func:`issuer`: it has fetched no key yet."""
    return start_api(_oidc(sophos_env, issuer)).url


def test_an_issuers_token_is_the_user_it_names(shared_oidc_api: str, shared_issuer: Issuer) -> None:
    oidc_api, issuer = shared_oidc_api, shared_issuer
    carol = whoami(oidc_api, issuer.token("carol")).json()
    assert carol == {"name": "carol", "operator": False, "via": "oidc"}
    operator = issuer.token("dave", groups=["staff", "sophos-operators"])
    assert whoami(oidc_api, operator).json()["operator"] is True
    assert whoami(oidc_api, issuer.token("erin", groups="staff")).json()["operator"] is False


@pytest.mark.parametrize("case", ["expired", "not_yet", "audience", "issuer", "no_sub", "none", "hmac",
                                  "foreign_key", "garbage"])
def test_a_token_the_issuer_did_not_vouch_for_is_refused(
    shared_oidc_api: str, shared_issuer: Issuer, case: str
) -> None:
    oidc_api, issuer = shared_oidc_api, shared_issuer
    key = issuer.keys[0]
    now = int(time.time())
    if case == "expired":
        token = issuer.token("carol", exp=now - 120)
    elif case == "not_yet":
        token = issuer.token("carol", nbf=now + 600)
    elif case == "audience":
        token = issuer.token("carol", aud="someone-else")
    elif case == "issuer":
        token = issuer.token("carol", iss="http://127.0.0.1:1")
    elif case == "no_sub":
        claims = issuer.claims("carol")
        del claims["sub"]
        import jwt

        token = jwt.encode(claims, key.private, algorithm="RS256", headers={"kid": key.kid})
    elif case == "none":
        token = _unsigned({"alg": "none", "kid": key.kid}, issuer.claims("carol")) + "."
    elif case == "hmac":
        # HS256 "signed" with the issuer's public key, which anyone can fetch from its JWKS.
        public = key.private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        body = _unsigned({"alg": "HS256", "kid": key.kid, "typ": "JWT"}, issuer.claims("carol"))
        token = f"{body}.{_b64(hmac.new(public, body.encode(), hashlib.sha256).digest())}"
    elif case == "foreign_key":
        token = issuer.token("carol", key=SigningKey.make(kid=key.kid))  # its key id, not its key
    else:
        token = "not.a.jwt"
    refused = whoami(oidc_api, token)
    assert refused.status_code == 401, (case, refused.text)
    assert error_code(refused) == "UNAUTHORIZED" and refused.json()["error"]["message"]


def test_rotated_keys_are_fetched_again_at_most_once_a_minute(oidc_api: str, issuer: Issuer) -> None:
    assert whoami(oidc_api, issuer.token("carol")).status_code == 200
    fetched = issuer.jwks_fetches
    assert fetched == 1
    # The issuer rotates: a token signed with the new key names a key id the API lacks.
    issuer.keys = [SigningKey.make(), *issuer.keys]
    assert whoami(oidc_api, issuer.token("carol", key=issuer.keys[0])).json()["name"] == "carol"
    assert issuer.jwks_fetches == fetched + 1
    # Made-up key ids do not make the API ask the issuer again within the minute.
    for _ in range(5):
        stranger = SigningKey.make()
        assert whoami(oidc_api, issuer.token("carol", key=stranger)).status_code == 401
    assert issuer.jwks_fetches == fetched + 1


def _old_postgres_database(url: str) -> str:
    """A PostgreSQL database as the version before identities left it (migrations 1 to 9), with
    one conversation and its run; its id."""
    import psycopg

    from shared.storage.schema import MIGRATIONS
    from shared.users import USERS_MIGRATION

    conversation = str(uuid.uuid4())
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE sophos_schema (version INTEGER NOT NULL)")
        conn.execute("INSERT INTO sophos_schema VALUES (%s)", (USERS_MIGRATION - 1,))
        for script in MIGRATIONS[: USERS_MIGRATION - 1]:
            conn.execute(script.encode())
        conn.execute(
            "INSERT INTO conversations (id, title, created_at, updated_at) VALUES (%s, %s, %s, %s)",
            (conversation, "kept from before", "2026-01-01T00:00:00.000Z", "2026-01-01T00:00:00.000Z"),
        )
        conn.execute(
            "INSERT INTO runs (id, conversation_id, kind, status, started_at) VALUES (%s, %s, 'run', "
            "'completed', '2026-01-01T00:00:00.000Z')", (str(uuid.uuid4()), conversation),
        )
    return conversation


@pytest.mark.backends
def test_an_old_database_upgrades_in_place_and_is_adopted(
    sophos_env: SophosEnv, backend: str, start_worker: Callable[..., ServiceProcess],
    start_api: Callable[..., ServiceProcess],
) -> None:
    if backend == "sqlite":
        sophos_env.database_path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(__file__).parent / "fixtures" / "pre-delta.db", sophos_env.database_path)
        kept = {"5f6e3afd-03b9-447f-adcb-1e591fd30ac5", "1e4f709c-3108-40f0-b536-047fee9b64d0",
                "e89c4b57-a81c-4fbd-8793-dcce4c97da7c"}
    else:
        kept = {_old_postgres_database(sophos_env["DATABASE_URL"])}
    alice, bob = add_user(sophos_env, "alice"), add_user(sophos_env, "bob")
    root = add_user(sophos_env, "root", "--operator")
    start_worker(sophos_env.with_(AUTH_ADOPT_OWNER="alice"))
    url = start_api(sophos_env).url

    def listed(key: str) -> dict[str, str]:
        page = httpx.get(f"{url}/api/conversations", headers={"authorization": f"Bearer {key}"}, timeout=10)
        return {c["id"]: c.get("owner", "") for c in page.json()["conversations"]}

    assert set(listed(alice)) == kept
    assert listed(bob) == {}
    assert listed(root) == dict.fromkeys(kept, "alice")
    one = next(iter(kept))
    headers = {"authorization": f"Bearer {bob}"}
    assert httpx.get(f"{url}/api/conversations/{one}", headers=headers, timeout=10).status_code == 404
    mine = httpx.get(f"{url}/api/conversations/{one}", headers={"authorization": f"Bearer {alice}"},
                     timeout=10)
    assert mine.status_code == 200 and mine.json()["conversation"]["owner"] == "alice"
