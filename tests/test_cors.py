"""CORS_ORIGINS, through the real API process: listed origins are let in, others stay out.

A browser asks first (a preflight ``OPTIONS`` naming the method and headers it wants to
send) and then reads an answer only if it carries ``Access-Control-Allow-Origin`` for the
page's origin. Both halves are checked as a browser would see them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from shared.settings import Settings
from shared.settings_parsing import SettingsError
from tests.support.env import SophosEnv
from tests.support.http import http_client

REPO = Path(__file__).resolve().parent.parent

LISTED = "http://app.example:3000"
OTHER_LISTED = "https://ui.example"
UNLISTED = "http://attacker.example"
TOKEN = "cors-test-token"


def preflight(http: httpx.Client, origin: str, method: str = "POST", headers: str = "") -> httpx.Response:
    request_headers = {"Origin": origin, "Access-Control-Request-Method": method}
    if headers:
        request_headers["Access-Control-Request-Headers"] = headers
    return http.options("/api/chat", headers=request_headers)


def allowed_origin(response: httpx.Response) -> str | None:
    return response.headers.get("access-control-allow-origin")


def test_origins_are_checked_and_normalized() -> None:
    settings = Settings.from_env({"CORS_ORIGINS": f" {LISTED}, HTTPS://UI.Example:443/ ,{LISTED}"})
    assert settings.cors_origins == (LISTED, OTHER_LISTED)
    assert Settings.from_env({}).cors_origins == ()
    for bad in ("app.example", "*", "null", "https://*.example", "https://app.example/path", "ftp://x"):
        with pytest.raises(SettingsError) as raised:
            Settings.from_env({"CORS_ORIGINS": f"{LISTED},{bad}"})
        assert raised.value.variable == "CORS_ORIGINS"


def test_a_bad_origin_stops_the_api_naming_the_variable(sophos_env: SophosEnv) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "api"],
        env=sophos_env.with_(CORS_ORIGINS="https://app.example/some/path"),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert done.returncode == 2 and "CORS_ORIGINS" in done.stderr, done


def test_listed_origins_are_let_in_without_a_token(sophos_env: SophosEnv, start_api) -> None:
    api = start_api(sophos_env.with_(CORS_ORIGINS=f"{LISTED},{OTHER_LISTED}"))
    with http_client(base_url=api.url, timeout=10) as http:
        for origin in (LISTED, OTHER_LISTED):
            asked = preflight(http, origin, "POST", "content-type, idempotency-key")
            assert asked.status_code in (200, 204), asked.text
            assert allowed_origin(asked) == origin
            assert set(asked.headers["access-control-allow-methods"].split(", ")) == {
                "GET",
                "POST",
                "PATCH",
                "DELETE",
                "OPTIONS",
            }
            assert "idempotency-key" in asked.headers["access-control-allow-headers"].lower()
        # What the page then sends: the browser guard admits it and the answer is readable.
        listed = http.get("/api/conversations", headers={"Origin": LISTED})
        assert listed.status_code == 200 and allowed_origin(listed) == LISTED
        assert "origin" in listed.headers.get("vary", "").lower()
        # A 429's wait; where the Agent Protocol's SDKs rejoin a run's stream.
        exposed = listed.headers["access-control-expose-headers"].split(", ")
        assert sorted(exposed) == ["Content-Location", "Location", "Retry-After"]
        assert "access-control-allow-credentials" not in listed.headers  # no cookies: the token is a header
        posted = http.post("/api/chat", json={"message": "hi"}, headers={"Origin": LISTED})
        assert posted.status_code == 202 and allowed_origin(posted) == LISTED
        # Another origin: no preflight passes, requests are refused, nothing is readable.
        asked = preflight(http, UNLISTED)
        assert asked.status_code >= 400 and allowed_origin(asked) is None
        refused = http.get("/api/conversations", headers={"Origin": UNLISTED})
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "FORBIDDEN"
        assert allowed_origin(refused) is None
        sneaked = http.post(
            "/api/chat",
            content=b'{"message": "hi"}',
            headers={"Origin": UNLISTED, "Content-Type": "text/plain"},
        )
        assert sneaked.status_code == 403
        # DNS rebinding stays refused for a listed origin too: the Host check is separate.
        rebound = http.get("/api/conversations", headers={"Origin": LISTED, "Host": "app.example:3000"})
        assert rebound.status_code == 403
    # Unset (the default): same origin only, as before the setting existed.
    default = start_api(sophos_env)
    with http_client(base_url=default.url, timeout=10) as http:
        asked = preflight(http, LISTED)
        assert asked.status_code == 403 and allowed_origin(asked) is None
        assert http.get("/api/conversations", headers={"Origin": LISTED}).status_code == 403


def test_with_a_token_the_preflight_needs_none_and_requests_still_do(
    sophos_env: SophosEnv, start_api
) -> None:
    api = start_api(sophos_env.with_(CORS_ORIGINS=LISTED, API_TOKEN=TOKEN))
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    with http_client(base_url=api.url, timeout=10) as http:
        # A browser never sends credentials with a preflight: it must pass without the token.
        asked = preflight(http, LISTED, "GET", "authorization, last-event-id")
        assert asked.status_code in (200, 204) and allowed_origin(asked) == LISTED, asked.text
        assert "authorization" in asked.headers["access-control-allow-headers"].lower()
        # The SDKs' key: the JavaScript SDK in a page of a listed origin sends it.
        asked = preflight(http, LISTED, "POST", "x-api-key, content-type")
        assert asked.status_code in (200, 204) and allowed_origin(asked) == LISTED, asked.text
        assert "x-api-key" in asked.headers["access-control-allow-headers"].lower()
        keyed = http.post("/threads/search", json={}, headers={"Origin": LISTED, "x-api-key": TOKEN})
        assert keyed.status_code == 200 and allowed_origin(keyed) == LISTED
        # The request itself still needs it; the 401 is readable by the page.
        anonymous = http.get("/api/conversations", headers={"Origin": LISTED})
        assert anonymous.status_code == 401 and allowed_origin(anonymous) == LISTED
        served = http.get("/api/conversations", headers={"Origin": LISTED, **bearer})
        assert served.status_code == 200 and allowed_origin(served) == LISTED
        # Another origin's page gets no CORS headers: its browser keeps the answer from it.
        assert allowed_origin(preflight(http, UNLISTED, "GET", "authorization")) is None
        assert allowed_origin(http.get("/api/conversations", headers={"Origin": UNLISTED, **bearer})) is None
