"""Secrets stay secret (issue 27): passwords in URLs, the token, and the fetch tool's destination.

The settings, the model probe and the fetch server's connections are tested in the
process (no server of ours started); what the API and the worker show is tested through
the real processes.
"""

from __future__ import annotations

import json
import re
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp.shared.exceptions import McpError
from mcp_server_fetch import server as upstream

from shared.model_probe import ModelState, describe, probe, probe_sync
from shared.redaction import redact_url
from shared.settings import Settings
from shared.settings_parsing import SettingsError
from tests.support.client import get_json, post_chat, read_sse
from tests.support.env import SophosEnv
from tests.support.http import async_http_client, http_client
from tests.support.listeners import Listeners, loopback_listeners
from tests.support.ports import free_port
from worker.agent.model_check import unavailable_message
from worker.tools import fetch_server

REPO = Path(__file__).resolve().parent.parent


def secret(prefix: str = "s3cret") -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


# --- passwords in URLs, the token: settings ---------------------------------------------------


def test_redact_url_hides_the_password_of_well_formed_and_malformed_urls() -> None:
    pw = secret()
    for url, shown in (
        (f"redis://:{pw}@redis:6379/0", "redis://:***@redis:6379/0"),
        (f"postgresql://sophos:{pw}@db:5432/sophos", "postgresql://sophos:***@db:5432/sophos"),
        (f"http://user:{pw}@127.0.0.1:11434", "http://user:***@127.0.0.1:11434"),
        (f"redis://:{pw}@redis:port/0", "redis://:***@redis:port/0"),  # a bad port
        (f"redis://:{pw}/x#y@redis:6379/0", "redis://:***@redis:6379/0"),  # unencoded / and # in it
        (f"user:{pw}@redis:6379", "user:***@redis:6379"),  # no scheme
        (f"unix:///run/redis.sock?db=0&password={pw}", "unix:///run/redis.sock?db=0&password=***"),
        (f"http://user:{pw}@h/?next=http://x", "http://user:***@h/?next=http://x"),
    ):
        assert redact_url(url) == shown, url
    for url in ("redis://127.0.0.1:6379/0", "http://user@h:1", "postgresql://db/sophos"):
        assert redact_url(url) == url


@pytest.mark.parametrize(
    ("variable", "template"),
    [
        ("REDIS_URL", "redis://:{pw}@127.0.0.1:63x9/0"),  # a bad port
        ("REDIS_URL", "http://:{pw}@127.0.0.1:6379/0"),  # not a redis scheme
        ("REDIS_URL", "sophos:{pw}@127.0.0.1:6379"),  # no scheme at all
        ("REDIS_URL", "redis://:{pw}@:6379/0"),  # no host
        ("OLLAMA_HOST", "http://user:{pw}@127.0.0.1:11x34"),
    ],
)
def test_a_malformed_url_is_refused_without_its_password(variable: str, template: str) -> None:
    pw = secret()
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({variable: template.format(pw=pw)})
    assert refused.value.variable == variable
    assert pw not in str(refused.value), str(refused.value)


def test_the_settings_repr_hides_the_token_and_every_password() -> None:
    token, db, rd, ol = secret("token"), secret("db"), secret("redis"), secret("ollama")
    settings = Settings.from_env({
        "API_TOKEN": token,
        "DATABASE_URL": f"postgresql://sophos:{db}@db:5432/sophos",
        "REDIS_URL": f"redis://default:{rd}@redis:6379/0",
        "OLLAMA_HOST": f"http://user:{ol}@ollama:11434",
    })
    for shown in (repr(settings), str(settings), f"{settings!r}", repr([settings])):
        for hidden in (token, db, rd, ol):
            assert hidden not in shown, shown
        # Still a useful repr: every field, the URLs with their hosts.
        assert "api_token='***'" in shown and "redis://default:***@redis:6379/0" in shown
        assert "postgresql://sophos:***@db:5432/sophos" in shown and "http://user:***@ollama:11434" in shown
        assert "ollama_model='qwen3'" in shown
    # The values themselves are untouched: only what is shown changes.
    assert settings.api_token == token and settings.redis_url.endswith(f"{rd}@redis:6379/0")
    assert "api_token=None" in repr(Settings.from_env({}))


# --- a password in OLLAMA_HOST --------------------------------------------------------------


async def test_the_model_probe_and_a_model_unavailable_message_name_the_host_without_its_password() -> None:
    pw = secret()
    host = f"http://sophos:{pw}@127.0.0.1:{free_port()}"  # nothing listens there
    checks = [probe_sync(host, "qwen3", timeout=5)]
    async with async_http_client() as http:
        checks.append(await probe(http, host, "qwen3", 5))
    settings = Settings.from_env({"OLLAMA_HOST": host})
    messages = [
        describe(ModelState.UNREACHABLE, host, "qwen3"),
        describe(ModelState.UNEXPECTED, host, "qwen3"),
        unavailable_message(httpx.ConnectError("refused"), settings),
        unavailable_message(RuntimeError("dropped mid-answer"), settings),
    ]
    for check in checks:
        assert check.state is ModelState.UNREACHABLE
        messages += [check.host, check.describe(), repr(check)]
    for message in messages:
        assert pw not in message, message
        assert "127.0.0.1" in message, message  # the host is still named


def test_a_password_in_ollama_host_reaches_no_run_error_log_or_readyz(
    sophos_env: SophosEnv, start_worker, start_api, model
) -> None:
    pw = secret()
    env = sophos_env.with_(OLLAMA_HOST=f"http://sophos:{pw}@127.0.0.1:{free_port()}")  # nothing there
    worker = start_worker(env)
    api = start_api(env)
    accepted = post_chat(api.url, "hello?")
    assert accepted.status_code == 202, accepted.text
    conversation, run = accepted.json()["conversation"], accepted.json()["run"]

    ending = read_sse(api.url, conversation)[-1]
    assert ending.event == "chat-error" and ending.data["code"] == "MODEL_UNAVAILABLE", ending.data
    assert "sophos:***@127.0.0.1" in ending.data["message"], ending.data
    shown = [json.dumps(ending.data), json.dumps(get_json(api.url, f"/api/runs/{run}"))]
    ready = get_json(api.url, "/api/readyz", expect=503)
    assert ready["checks"]["model"] is False and "sophos:***@127.0.0.1" in ready["error"]["message"], ready
    shown.append(json.dumps(ready))
    for text in shown:
        assert pw not in text, text
    for proc in (worker, api):
        assert proc.log_text().strip(), f"{proc.name} wrote no log"
        assert pw not in proc.log_text(), f"the password appears in the log of {proc.name}"
    # The worker did say, at start, what is wrong with the model (so its log was looked at).
    assert any(r.get("event") == "model.missing" for r in worker.log_records())


# --- the token in a query string --------------------------------------------------------------


def test_a_query_token_is_taken_only_by_the_event_stream_and_the_export(
    sophos_env: SophosEnv, start_api
) -> None:
    token = secret("token")
    api = start_api(sophos_env.with_(API_TOKEN=token))
    unknown = str(uuid.uuid4())
    taken = {("GET", "/api/chat"), ("GET", "/api/conversations/{conversation_id}/export")}
    with http_client(base_url=api.url, timeout=10) as http:
        paths = http.get("/schema/openapi.json").json()["paths"]
        routes = [
            (method.upper(), path)
            for path, operations in paths.items()
            if path.startswith("/api/") and path not in ("/api/healthz", "/api/signin")
            for method in operations
            if method in ("get", "post", "put", "patch", "delete")
        ]
        assert taken < set(routes) and len(routes) >= 8, routes
        for method, path in [*routes, ("GET", "/metrics")]:
            url = re.sub(r"\{[^}]+\}", unknown, path)
            body = {"message": "hello"} if method != "GET" else None
            params = {"conversation": unknown, "access_token": token}
            response = http.request(method, url, json=body, params=params)
            if (method, path) in taken:
                # Past the guard: the unknown conversation is what answers.
                assert response.status_code == 404, f"{method} {path}: {response.status_code} {response.text}"
                continue
            assert response.status_code == 401, f"{method} {path}: {response.status_code} {response.text}"
            error = response.json()
            assert set(error) == {"error"} and error["error"]["code"] == "UNAUTHORIZED", error
            assert "Authorization header" in error["error"]["message"], error
            # The same request with the header is let in.
            del params["access_token"]
            headers = {"Authorization": f"Bearer {token}"}
            let_in = http.request(method, url, json=body, params=params, headers=headers)
            assert let_in.status_code != 401, f"{method} {path}: {let_in.status_code} {let_in.text}"


# --- the fetch tool: one resolution, checked and connected to --------------------------------


@pytest.fixture
def loopback_page() -> Iterator[Listeners]:
    with loopback_listeners() as page:
        yield page


class Resolver:
    """``socket.getaddrinfo`` for test names: each lookup takes the next answer (the last one repeats).

    Other names go to the real resolver. Both mcp-server-fetch's check and the
    connections resolve through ``socket.getaddrinfo`` (in a thread of the loop).
    """

    def __init__(self) -> None:
        self.answers: dict[str, list[tuple[str, ...]]] = {}
        self.lookups: dict[str, int] = {}
        self._real = socket.getaddrinfo

    def __call__(self, host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else host
        if name not in self.answers:
            return self._real(host, port, *args, **kwargs)
        self.lookups[name] = self.lookups.get(name, 0) + 1
        queue = self.answers[name]
        addresses = queue.pop(0) if len(queue) > 1 else queue[0]
        number = int(port or 0)
        return [
            (socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (a, number, 0, 0))
            if ":" in a
            else (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (a, number))
            for a in addresses
        ]


@pytest.fixture
def resolver(monkeypatch: pytest.MonkeyPatch) -> Resolver:
    fake = Resolver()
    monkeypatch.setattr(socket, "getaddrinfo", fake)
    return fake


#: a public address (TEST-NET is not public: this is example.com's old one); never connected to
PUBLIC = "93.184.216.34"


async def test_a_name_that_rebinds_between_check_and_connect_never_reaches_loopback(
    resolver: Resolver, loopback_page: Listeners, monkeypatch: pytest.MonkeyPatch
) -> None:
    port, hits = loopback_page.port, loopback_page.hits
    url = f"http://rebind.sophos.test:{port}/secret"
    # The control: mcp-server-fetch alone checks the first answer and connects to the second.
    # (Should it ever stop doing so, worker/tools/fetch_server.py may no longer be needed.)
    resolver.answers["rebind.sophos.test"] = [(PUBLIC,), ("127.0.0.1",)]
    content, _ = await upstream.fetch_url(url, "sophos-test")
    assert "inside" in content and len(hits) == 1, hits

    # The shipped server: the same two answers never reach the page.
    hits.clear()
    resolver.answers["rebind.sophos.test"] = [(PUBLIC,), ("127.0.0.1",)]
    monkeypatch.setattr(upstream, "make_client", fetch_server.make_client)
    with pytest.raises(McpError, match="not a public address") as refused:
        await upstream.fetch_url(url, "sophos-test")
    assert "127.0.0.1" in str(refused.value)
    # Nor do robots.txt's check, or a name with a loopback address among public ones.
    resolver.answers["rebind.sophos.test"] = [(PUBLIC,), ("127.0.0.1",)]
    with pytest.raises(McpError, match="not a public address"):
        await upstream.check_may_autonomously_fetch_url(url, "sophos-test")
    resolver.answers["rebind.sophos.test"] = [(PUBLIC,), (PUBLIC, "127.0.0.1")]
    with pytest.raises(McpError, match="not a public address"):
        await upstream.fetch_url(url, "sophos-test")
    assert hits == []

    # What is connected to is the answer that was checked, under the name: here 127.0.0.1
    # stands for a public address (the only one allowed), and a later answer would be refused.
    resolver.answers["pinned.sophos.test"] = [("127.0.0.1",), ("127.0.0.2",)]
    transport = fetch_server.PinnedTransport(allowed=lambda address: address == "127.0.0.1")
    async with async_http_client(transport=transport) as http:
        response = await http.get(f"http://pinned.sophos.test:{port}/page")
    assert response.status_code == 200 and response.text == "inside\n"
    assert hits == [f"GET /page Host=pinned.sophos.test:{port}"]
    assert resolver.lookups["pinned.sophos.test"] == 1


def test_the_shipped_config_runs_the_pinned_fetch_server() -> None:
    fetch = json.loads((REPO / "config" / "mcp.json").read_text())["mcpServers"]["fetch"]
    assert fetch["args"][:2] == ["-m", "worker.tools.fetch_server"], fetch
    assert "--allow-private-ips" not in fetch["args"]
