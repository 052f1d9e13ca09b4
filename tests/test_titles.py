"""Titles: PATCH /api/conversations/{id} renames (through the worker), ``?q=`` searches them.

Real worker, API, Redis and database (SQLite, and PostgreSQL where marked); the model is the
fake Ollama, whose ``Hang`` reply holds the worker (one job at a time) while a test needs it.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import redis as redis_sync

from shared.redis.keys import QUEUE_NAME
from tests.fakes.ollama import FakeOllama, Hang, Text
from tests.support.client import get_json, post_chat, read_sse, wait_for
from tests.support.env import SophosEnv
from tests.support.http import http_client


def chat(api: str, message: str) -> str:
    response = post_chat(api, message)
    assert response.status_code == 202, response.text
    conversation = str(response.json()["conversation"])
    read_sse(api, conversation)
    return conversation


def rename(api: str, conversation: str, body: Any) -> httpx.Response:
    with http_client(base_url=api, timeout=15) as http:
        return http.patch(f"/api/conversations/{conversation}", json=body)


def titles(api: str, **params: Any) -> dict[str, str]:
    listing = get_json(api, "/api/conversations", limit=200, **params)
    return {c["id"]: c["title"] for c in listing["conversations"]}


def error(response: httpx.Response, status: int) -> tuple[str, str]:
    assert response.status_code == status, response.text
    body = response.json()["error"]
    return body["code"], body["message"]


@pytest.mark.backends
def test_rename_is_written_by_the_worker_and_a_refused_one_changes_nothing(
    backend: str, sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama,
    redis_sync_client: redis_sync.Redis,
) -> None:
    start_worker(sophos_env)
    api = start_api(sophos_env).url
    model.script(Text("answer"))
    conversation = chat(api, "**hello** there")

    done = rename(api, conversation, {"title": "  Trip\n to   Lisbon "})
    assert done.status_code == 200, done.text
    assert done.json() == {"conversation": conversation, "title": "Trip to Lisbon", "status": "renamed"}
    assert titles(api) == {conversation: "Trip to Lisbon"}
    assert get_json(api, f"/api/conversations/{conversation}")["conversation"]["title"] == "Trip to Lisbon"

    refused = [
        (rename(api, conversation, {"title": ""}), 422, "INVALID_TITLE", "empty"),
        (rename(api, conversation, {"title": " \n\t "}), 422, "INVALID_TITLE", "empty"),
        (rename(api, conversation, {"title": "x" * 201}), 422, "INVALID_TITLE", "at most 200"),
        (rename(api, conversation, {"title": "a\x00b"}), 422, "INVALID_TITLE", "control characters"),
        (rename(api, conversation, {}), 400, "BAD_REQUEST", "title"),
        (rename(api, conversation, {"title": 7}), 400, "BAD_REQUEST", "title"),
        (rename(api, "not-a-uuid", {"title": "x"}), 400, "BAD_REQUEST", "conversation id"),
        (rename(api, "00000000-0000-4000-8000-000000000000", {"title": "x"}), 404, "NOT_FOUND", "not found"),
    ]
    for response, status, code, words in refused:
        got_code, message = error(response, status)
        assert (got_code, words in message) == (code, True), message
    assert redis_sync_client.zcard(QUEUE_NAME) == 0  # nothing was enqueued for them
    assert titles(api) == {conversation: "Trip to Lisbon"}
    assert rename(api, conversation, {"title": "x" * 200}).status_code == 200

    # The worker busy with another run (one job at a time): 202, written when it takes the job.
    slow = Hang(text="busy ")
    model.script(slow)
    busy = post_chat(api, "keeps the worker busy").json()["conversation"]
    slow.wait_started()
    accepted = rename(api, conversation, {"title": "Later"})
    assert accepted.status_code == 202, accepted.text
    assert accepted.json() == {"conversation": conversation, "title": "Later", "status": "renaming"}
    slow.release()
    read_sse(api, busy)
    wait_for(lambda: titles(api).get(conversation) == "Later", timeout=20, message="the worker to rename")


@pytest.mark.backends
def test_search_finds_a_part_of_the_title_whatever_its_case_and_wildcards_are_plain_characters(
    backend: str, sophos_env: SophosEnv, start_worker, start_api, model: FakeOllama,
) -> None:
    start_worker(sophos_env)
    api = start_api(sophos_env).url
    model.default_text = "noted"
    trip, budget, names, school = (
        chat(api, m) for m in ("Trip to LISBON", "Budget: 100% done", "snake_case names", "École d'été")
    )

    def found(q: str, **params: Any) -> list[str]:
        return list(titles(api, q=q, **params))

    assert found("lisbon") == [trip]
    assert found("%") == [budget]  # not every title, as an unescaped LIKE would match
    assert found("_") == [names]
    assert found("a_e") == []  # "_" is no wildcard: it would match "ake" of "snake"
    assert found("école") == [school] and found("ÉCOLE") == [school]
    assert found("nothing like it") == []
    assert set(found("")) == {trip, budget, names, school}

    # A conversation whose first run is still queued (no row yet) is searched too, and pages.
    slow = Hang(text="busy ")
    model.script(slow)
    queued = post_chat(api, "Lisbon, again").json()["conversation"]
    slow.wait_started()
    waiting = post_chat(api, "lisbon the third").json()["conversation"]
    first = get_json(api, "/api/conversations", q="LISBON", limit=2)
    assert [c["id"] for c in first["conversations"]] == [waiting, queued]
    assert first["conversations"][0]["status"] == "queued"
    rest = get_json(api, "/api/conversations", q="LISBON", limit=2, cursor=first["nextCursor"])
    assert [c["id"] for c in rest["conversations"]] == [trip] and rest["nextCursor"] is None
    slow.release()

    with http_client(base_url=api, timeout=15) as http:
        code, message = error(http.get("/api/conversations", params={"q": "x" * 201}), 400)
        assert code == "BAD_REQUEST" and "q" in message
        code, message = error(http.get("/api/conversations", params={"q": "a\x00b"}), 400)
        assert (code, message) == ("BAD_REQUEST", "q must not contain control characters")
