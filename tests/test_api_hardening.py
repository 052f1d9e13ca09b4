"""The API under hostile conditions: its database vanishing mid-read, hostile numbers and
headers, clients that give up before their body, cheap scrapes.

Real worker, API, Redis and SQLite file; the model is the fake Ollama.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sqlite3
import time
from typing import Any

import httpx
import pytest

from api import store
from tests.fakes.ollama import FakeOllama, Hang
from tests.support.client import post_chat, read_sse, wait_for
from tests.support.env import SophosEnv
from tests.support.http import async_http_client, http_client
from tests.support.metrics import gauge


def chat(api: str, message: str, conversation: str | None = None) -> tuple[str, str]:
    response = post_chat(api, message, conversation)
    assert response.status_code == 202, response.text
    return response.json()["conversation"], response.json()["run"]


# --- the store under concurrency (issue 11.5) ------------------------------------------------


async def test_reads_in_flight_survive_the_database_vanishing_and_coming_back(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    start_worker(sophos_env)
    api = start_api(sophos_env).url
    model.default_text = "a reply long enough to take a moment to decode " * 20
    conversations = []
    for i in range(4):
        conversation, _ = chat(api, f"conversation {i}")
        read_sse(api, conversation)
        conversations.append(conversation)
    database = sophos_env.database_path
    away = database.with_name("sophos.db.away")
    statuses: dict[int, int] = {}
    bodies: list[str] = []
    stop = asyncio.Event()

    async def reader(http: httpx.AsyncClient, n: int) -> None:
        paths = [f"/api/conversations/{c}" for c in conversations] + ["/api/conversations", "/metrics"]
        while not stop.is_set():
            response = await http.get(paths[n % len(paths)])
            n += 1
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            if response.status_code >= 500 and response.status_code != 503:
                bodies.append(response.text)

    async def toggle() -> int:
        # The file goes away (the store retires its connection) and comes back (it opens
        # another), again and again while reads are using the connection.
        flips = 0
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            os.rename(database, away)
            await asyncio.sleep(0.01)
            os.rename(away, database)
            await asyncio.sleep(0.02)
            flips += 1
        return flips

    async with async_http_client(base_url=api, timeout=10) as http:
        readers = [asyncio.create_task(reader(http, n)) for n in range(8)]
        flips = await toggle()
        stop.set()
        await asyncio.gather(*readers)
    assert flips > 20
    assert sum(statuses.values()) > 100, statuses
    assert bodies == [], bodies[:3]
    # 404: a conversation asked for while the file was away; 503: a read the vanishing file broke.
    assert set(statuses) <= {200, 404, 503}, statuses
    # And the store is healthy afterwards.
    async with async_http_client(base_url=api, timeout=10) as http:
        for conversation in conversations:
            assert (await http.get(f"/api/conversations/{conversation}")).status_code == 200


# --- cheaper scrapes (issue 11.6) ------------------------------------------------------------


def test_the_running_gauge_is_right_and_its_query_searches_the_status_index(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    start_worker(sophos_env)
    api = start_api(sophos_env).url
    for i in range(3):
        conversation, _ = chat(api, f"done {i}")
        read_sse(api, conversation)
    assert gauge(api, "sophos_runs_running") == 0
    slow = Hang(text="slow ")
    model.script(slow)
    chat(api, "running")
    slow.wait_started()
    wait_for(lambda: gauge(api, "sophos_runs_running") == 1, message="one run running")
    slow.release()
    wait_for(lambda: gauge(api, "sophos_runs_running") == 0, message="no run running")
    # The scrape's query, on the file the worker made: a search of the index for one
    # status, not a scan of every run (what GROUP BY status did at each scrape).
    readonly = f"{sophos_env.database_path.as_uri()}?mode=ro"
    with contextlib.closing(sqlite3.connect(readonly, uri=True)) as conn:
        rows = conn.execute(f"EXPLAIN QUERY PLAN {store.RUNNING_COUNT_SQL}", ("running",))
        found = " | ".join(r[3] for r in rows)
    assert found == "SEARCH runs USING COVERING INDEX runs_by_status (status=?)", found


# --- hostile input (issue 11.10) -------------------------------------------------------------


def test_last_event_id_beyond_what_a_stream_can_hold_is_refused_before_the_stream(
    sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama
) -> None:
    start_worker(sophos_env)
    api = start_api(sophos_env).url
    slow = Hang(text="still going ")
    model.script(slow)
    conversation, _ = chat(api, "a running run")
    slow.wait_started()
    url = f"{api}/api/chat"
    with http_client(timeout=10) as http:
        for raw in (
            "99999999999999999999",
            "9223372036854775808",
            "-1",
            "+5",
            "1_000",
            "٣",
            "1e3",
            "0x10",
            "9" * 5000,
        ):
            for response in (
                http.get(url, params={"conversation": conversation}, headers={"Last-Event-ID": raw.encode()}),
                http.get(url, params={"conversation": conversation, "lastEventId": raw}),
            ):
                assert response.status_code == 400, (raw[:30], response.status_code, response.text)
                error = response.json()["error"]
                assert error["code"] == "BAD_REQUEST" and "Last-Event-ID" in error["message"]
        # The largest id taken: the stream opens and waits for what comes after it.
        with http.stream(
            "GET", url, params={"conversation": conversation}, headers={"Last-Event-ID": str(2**63 - 1)}
        ) as stream:
            assert stream.status_code == 200
            first = next(stream.iter_lines())
            assert first.startswith(":"), first  # a ping, not a broken connection
    slow.release()
    assert read_sse(api, conversation).types[-1] == "end"


def raw_request(api: str, data: bytes) -> bytes:
    host, port = api.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(data)
        chunks = []
        with contextlib.suppress(ConnectionError, TimeoutError):
            while chunk := sock.recv(65536):
                chunks.append(chunk)
    return b"".join(chunks)


def request_lines(api_proc: Any, method: str) -> list[dict[str, Any]]:
    return [r for r in api_proc.log_records() if r.get("event") == "request" and r.get("method") == method]


def test_a_client_that_gives_up_before_its_body_is_not_logged_as_a_5xx(
    sophos_env: SophosEnv, start_api
) -> None:
    api_proc = start_api(sophos_env)
    host, port = api_proc.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            b"POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000\r\n\r\n{"message": '
        )
        # ... and goes away before the rest of its body.
    line = wait_for(lambda: request_lines(api_proc, "POST"), message="the request's log line")[0]
    assert line["status"] is None and line["outcome"] == "client_disconnected", line
    assert not [r for r in api_proc.log_records() if r.get("event") == "request.failed"]
    # An answered request is logged as it was answered.
    assert post_chat(api_proc.url, "").status_code == 400
    answered = wait_for(lambda: request_lines(api_proc, "POST")[1:], message="the second log line")[0]
    assert answered["status"] == 400 and "outcome" not in answered


@pytest.mark.parametrize("parser", ["h11", "httptools"])
def test_headers_beyond_8_kib_are_refused_without_waiting_for_their_end(
    sophos_env: SophosEnv, start_api, parser: str
) -> None:
    proc = start_api(sophos_env.with_(API_HTTP=parser))
    api = proc.url
    assert proc.wait_for_log("api.started").find(f'"http": "{parser}"') > 0
    head = b"GET /api/healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nX-Pad: "
    assert raw_request(api, head + b"a" * 4000 + b"\r\n\r\n").startswith(b"HTTP/1.1 200")
    # A body is not a head: a POST of 64 KiB with its headers in one packet is read whole.
    body = json.dumps({"message": "x" * 65_000}).encode()
    post = (b"POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
    assert raw_request(api, post + body).startswith(b"HTTP/1.1 400")  # past MAX_MESSAGE_CHARS, not the head
    # Headers that never end: the server gives up on them once they pass the bound,
    # rather than keeping all it is sent (a 50 MB header was taken before).
    host, port = api.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head)
        answer = b""
        with contextlib.suppress(ConnectionError):
            for _ in range(64):
                sock.sendall(b"a" * 1024)
        with contextlib.suppress(ConnectionError):
            while chunk := sock.recv(65536):  # a timeout here (10 s) fails the test
                answer += chunk
    assert answer == b"" or answer.startswith(b"HTTP/1.1 4"), answer[:100]
