"""Ownership on every route (DESIGN.md "People and what they may touch"), generated from the app's
own OpenAPI document: a route added tomorrow is in it, and fails here if it forgets the check.

Alice makes one of everything a user owns (a conversation and its run, a thread and its run, a
thread created empty, a cron, an assistant, an answered Idempotency-Key, an item in the Store).
Then, for every route of the document, Bob asks about Alice's ids and about ids that exist
nowhere: the two answers must be the same (404, or the same refusal of the same bad request), so
nothing of Alice's is revealed to him, by status or by error code. Lists, searches and counts must
not mention Alice's ids at all; an operator route is 403 for Bob. Alice, asking the same reads,
finds her own (so the test cannot pass by finding nothing). Real processes, real Redis, on SQLite
and on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client

from shared.contracts.protocol import ASSISTANT_ID
from tests.fakes.ollama import FakeOllama, Text
from tests.support.client import read_sse
from tests.support.env import SophosEnv
from tests.support.http import async_http_client
from tests.support.procs import ServiceProcess
from tests.support.users import add_user

pytestmark = pytest.mark.backends

#: bodies that pass validation, so a refusal is about the resource, not the request
BODIES: dict[tuple[str, str], dict[str, Any]] = {
    ("POST", "/api/chat"): {"message": "hello again", "conversation": "{conversation_id}"},
    ("POST", "/api/conversations/{conversation_id}/branch"): {
        "message": "00000000-0000-4000-8000-000000000000"},
    ("PATCH", "/api/conversations/{conversation_id}"): {"title": "renamed by someone"},
    ("PATCH", "/threads/{thread_id}"): {"metadata": {"touched": True}},
    ("POST", "/threads/{thread_id}/history"): {"limit": 10},
    ("POST", "/threads/{thread_id}/state"): {
        "values": {"messages": [{"role": "user", "content": "sneaked in"}]}, "as_node": "agent"},
    ("POST", "/threads/{thread_id}/state/checkpoint"): {"checkpoint": {"checkpoint_id": "{checkpoint_id}"}},
    ("POST", "/threads/{thread_id}/runs"): {"assistant_id": "agent", "input": {"messages": [
        {"role": "user", "content": "hi"}]}},
    ("POST", "/threads/{thread_id}/runs/stream"): {"assistant_id": "agent", "input": {"messages": [
        {"role": "user", "content": "hi"}]}},
    ("POST", "/threads/{thread_id}/runs/wait"): {"assistant_id": "agent", "input": {"messages": [
        {"role": "user", "content": "hi"}]}},
    # threads.stream: a run started on a thread id (the SDK mints it), the thread's events
    ("POST", "/threads/{thread_id}/commands"): {"id": 1, "method": "run.start", "params": {
        "assistant_id": "agent", "input": {"messages": [{"role": "user", "content": "hi"}]}}},
    ("POST", "/threads/{thread_id}/stream/events"): {"channels": ["lifecycle", "values", "messages"]},
    ("POST", "/threads/{thread_id}/runs/crons"): {
        "assistant_id": "agent", "schedule": "0 0 1 1 *",
        "input": {"messages": [{"role": "user", "content": "hi"}]}},
    ("POST", "/threads"): {"thread_id": "{thread_id}", "if_exists": "do_nothing"},
    ("POST", "/threads/search"): {"limit": 100},
    ("POST", "/threads/prune"): {"thread_ids": ["{thread_id}"]},
    ("POST", "/runs/crons/search"): {"limit": 100},
    ("PATCH", "/runs/crons/{cron_id}"): {"enabled": False, "schedule": "0 0 2 1 *"},
    ("POST", "/assistants/search"): {},
    ("POST", "/assistants/count"): {},
    ("POST", "/assistants"): {"graph_id": "agent", "name": "bob's own"},
    ("PATCH", "/assistants/{assistant_id}"): {"name": "renamed by someone"},
    ("POST", "/assistants/{assistant_id}/versions"): {"limit": 10},
    ("POST", "/assistants/{assistant_id}/latest"): {"version": 1},
    ("POST", "/runs/crons"): {"assistant_id": "agent", "schedule": "0 0 1 1 *",
                              "input": {"messages": [{"role": "user", "content": "hi"}]}},
    ("PUT", "/store/items"): {"namespace": ["notes"], "key": "{store_key}", "value": {"text": "someone's"}},
    ("DELETE", "/store/items"): {"namespace": ["notes"], "key": "{store_key}"},
    ("POST", "/store/items/search"): {"namespace_prefix": ["notes"]},
    ("POST", "/store/namespaces"): {"prefix": ["notes"]},
}
#: ids a route takes outside its path
QUERIES: dict[tuple[str, str], dict[str, str]] = {
    ("GET", "/api/chat"): {"conversation": "{conversation_id}"},
    ("GET", "/api/runs"): {"conversation": "{conversation_id}"},
    ("GET", "/store/items"): {"namespace": "notes", "key": "{store_key}"},
}
#: routes that are everyone's to read (no user's resource behind them)
PUBLIC = {"/api/healthz", "/ok", "/info", "/api/readyz", "/api/agent", "/api/whoami", "/api/signin"}
OPERATOR_ONLY = {"/metrics"}
#: routes whose answer to Alice never ends (a thread's stream follows it until its client
#: leaves): Bob's answers are compared, Alice's own is not read
ENDLESS = {("GET", "/threads/{thread_id}/stream"), ("POST", "/threads/{thread_id}/stream/events")}
#: routes that create what they name: a free id is the caller's to take
CREATES = {("POST", "/threads"), ("POST", "/threads/{thread_id}/commands")}
#: served, and not in the document: /mcp is one JSON-RPC endpoint (MCP over Streamable HTTP,
#: api/protocol/mcp.py), not routes the walk could ask; its tools and a call on another user's
#: thread are asked below, with the real MCP client (tests/test_mcp_server.py tests the rest)
NOT_IN_DOCUMENT = {"/mcp"}


@dataclass
class Caller:
    url: str
    key: str

    def ask(self, method: str, path: str, *, params: dict[str, str] | None = None,
            body: dict[str, Any] | None = None, headers: dict[str, str] | None = None) -> httpx.Response:
        sent = {"authorization": f"Bearer {self.key}", **(headers or {})}
        with httpx.stream(method, f"{self.url}{path}", params=params, json=body, headers=sent,
                          timeout=30) as answer:
            # A stream of a finished run ends by itself; a refusal is one short body.
            answer.read()
            return answer


def answer_of(response: httpx.Response) -> tuple[int, str | None]:
    try:
        error = response.json().get("error", {}).get("code")
    except (ValueError, AttributeError):
        error = None
    return response.status_code, error


def fill(template: Any, ids: dict[str, str]) -> Any:
    if isinstance(template, str):
        return re.sub(r"\{(\w+)\}", lambda m: ids.get(m.group(1), m.group(0)), template)
    if isinstance(template, dict):
        return {k: fill(v, ids) for k, v in template.items()}
    if isinstance(template, list):
        return [fill(v, ids) for v in template]
    return template


def routes(url: str, key: str) -> list[tuple[str, str]]:
    document = httpx.get(f"{url}/schema/openapi.json", headers={"authorization": f"Bearer {key}"}).json()
    found = [(m.upper(), p) for p, ops in document["paths"].items() for m in ops
             if m in ("get", "post", "put", "patch", "delete")]
    assert len(found) > 40, found  # the whole app, native and Agent Protocol
    assert not NOT_IN_DOCUMENT & set(document["paths"]), "now in the document: walk it, or say why not"
    return found


def mcp_text(result: types.CallToolResult) -> str:
    return " ".join(b.text for b in result.content if isinstance(b, types.TextContent))


async def over_mcp(url: str, key: str, thread_id: str) -> tuple[set[str], str, str]:
    """Through /mcp: the caller's tools, and a call on ``thread_id`` and on a thread nobody has."""
    http = async_http_client(headers={"authorization": f"Bearer {key}"}, timeout=httpx.Timeout(30, read=300))
    async with http, streamable_http_client(f"{url}/mcp", http_client=http) as (read, write, _), \
            ClientSession(read, write) as session:
        await session.initialize()
        tools = {t.name for t in (await session.list_tools()).tools}
        theirs = await session.call_tool("agent", {"message": "mine now", "thread_id": thread_id})
        nowhere = await session.call_tool("agent", {"message": "mine now", "thread_id": str(uuid.uuid4())})
    return tools, mcp_text(theirs), mcp_text(nowhere)


def test_another_users_resources_are_absent_on_every_route(
    sophos_env: SophosEnv, model: FakeOllama, start_worker: Callable[..., ServiceProcess],
    start_api: Callable[..., ServiceProcess],
) -> None:
    alice_key = add_user(sophos_env, "alice")
    bob_key = add_user(sophos_env, "bob")
    root_key = add_user(sophos_env, "root", "--operator")
    start_worker(sophos_env)
    url = start_api(sophos_env).url
    alice, bob, root = Caller(url, alice_key), Caller(url, bob_key), Caller(url, root_key)

    # Alice makes one of everything.
    accepted = alice.ask("POST", "/api/chat", body={"message": "alice's secret plans"},
                         headers={"Idempotency-Key": "shared-key"}).json()
    conversation_id, run_id = accepted["conversation"], accepted["run"]
    assert read_sse(url, conversation_id, token=alice_key)[-1].event == "end"
    made = alice.ask("POST", "/threads", body={"metadata": {"owner": "bob", "mine": 1}})
    thread_id = made.json()["thread_id"]
    waited = alice.ask("POST", f"/threads/{thread_id}/runs/wait", body=BODIES[
        ("POST", "/threads/{thread_id}/runs/wait")])
    assert waited.status_code == 200, waited.text
    thread_runs = alice.ask("GET", f"/threads/{thread_id}/runs").json()
    thread_run_id = thread_runs[0]["run_id"]
    empty_id = alice.ask("POST", "/threads", body={}).json()["thread_id"]
    cron = alice.ask("POST", f"/threads/{thread_id}/runs/crons", body=BODIES[
        ("POST", "/threads/{thread_id}/runs/crons")])
    assert cron.status_code == 200, cron.text
    cron_id = cron.json()["cron_id"]
    assistant = alice.ask("POST", "/assistants", body={"graph_id": "agent", "name": "alice's secret helper",
                                                       "context": {"system_prompt": "alice's secret"}})
    assert assistant.status_code == 200, assistant.text
    assistant_id = assistant.json()["assistant_id"]
    state = alice.ask("GET", f"/threads/{thread_id}/state").json()
    checkpoint_id = state["checkpoint"]["checkpoint_id"]
    store_key = str(uuid.uuid4())
    stored = alice.ask("PUT", "/store/items", body={
        "namespace": ["notes"], "key": store_key, "value": {"text": "alice's secret note"}})
    assert stored.status_code == 204, stored.text
    # The server says whose a thread is (and, once it has run, its graph); a client cannot say otherwise.
    ran = {"graph_id": "agent", "assistant_id": ASSISTANT_ID}
    got = alice.ask("GET", f"/threads/{thread_id}").json()["metadata"]
    assert got == {"owner": "alice", "mine": 1, **ran}

    secrets = {conversation_id, run_id, thread_id, thread_run_id, empty_id, cron_id, assistant_id,
               "alice's secret"}
    theirs = {"conversation_id": conversation_id, "thread_id": thread_id, "run_id": run_id,
              "cron_id": cron_id, "checkpoint_id": checkpoint_id, "store_key": store_key,
              "assistant_id": assistant_id}

    def nowhere() -> dict[str, str]:
        fresh = ("conversation_id", "thread_id", "run_id", "cron_id", "store_key", "assistant_id")
        return {**theirs, **{k: str(uuid.uuid4()) for k in fresh}}

    checked = 0
    for method, path in routes(url, root_key):
        key = (method, path)
        ids_in = set(re.findall(r"\{(\w+)\}", path)) | {
            m for t in (BODIES.get(key), QUERIES.get(key)) if t for m in re.findall(r"\{(\w+)\}", str(t))
        }
        owned = ids_in - {"checkpoint_id"}
        mine = dict(theirs)
        if path.startswith("/threads/{thread_id}/runs/{run_id}"):
            mine["run_id"] = thread_run_id

        def request(who: Caller, ids: dict[str, str], path: str = path, key: tuple[str, str] = key,
                    method: str = method) -> httpx.Response:
            return who.ask(method, fill(path, ids),
                           params=fill(QUERIES.get(key), ids), body=fill(BODIES.get(key), ids))

        if path in OPERATOR_ONLY:
            assert answer_of(request(bob, mine)) == (403, "FORBIDDEN"), key
            assert request(root, mine).status_code == 200, key
            continue
        if not owned:
            answer = request(bob, mine)
            if path not in PUBLIC:
                leaked = [s for s in secrets if s in answer.text]
                assert not leaked, (key, leaked, answer.text[:300])
            continue
        answer = request(bob, mine)
        seen = answer_of(answer)
        if key in CREATES:
            # An id nobody has is Bob's to take; Alice's is refused as absent (404, never 409).
            assert seen == (404, "NOT_FOUND") and "alice" not in answer.text, (key, seen)
            checked += 1
            continue
        unknown = answer_of(request(bob, nowhere()))
        assert seen == unknown, (key, "Bob told Alice's apart from nothing", seen, unknown)
        # A refusal, or a filter that found nothing of his (GET /api/runs?conversation=…).
        assert seen[0] in (400, 404, 422) or not [s for s in secrets if s in answer.text], (key, seen)
        if method == "GET" and key not in ENDLESS:
            assert request(alice, mine).status_code != 404, (key, "Alice could not find her own")
        checked += 1
    assert checked >= 20, checked

    # /mcp (not in the document): Alice's assistant is no tool of Bob's, and her thread is as
    # absent to his call as a thread nobody has; Alice finds both hers.
    tools, hers, nobodys = asyncio.run(over_mcp(url, bob_key, thread_id))
    assert tools == {"agent", "bob_s_own"} and hers.startswith("NOT_FOUND")  # his, made by the walk
    assert hers.replace(thread_id, "T") == re.sub(r"[0-9a-f-]{36}", "T", nobodys)
    assert not [s for s in secrets if s in hers.replace(thread_id, "")]
    model.script(Text("Alice's own answer."))
    tools, own, _ = asyncio.run(over_mcp(url, alice_key, thread_id))
    assert tools == {"agent", "alice_s_secret_helper"} and own == "Alice's own answer."

    # Alice's assistant runs nothing of Bob's; the default is everyone's.
    bob_thread = bob.ask("POST", "/threads", body={}).json()["thread_id"]
    runs = f"/threads/{bob_thread}/runs"
    run_body = BODIES[("POST", "/threads/{thread_id}/runs")]
    hers = bob.ask("POST", runs, body={**run_body, "assistant_id": assistant_id})
    unknown = bob.ask("POST", runs, body={**run_body, "assistant_id": str(uuid.uuid4())})
    assert answer_of(hers) == answer_of(unknown) == (404, "NOT_FOUND") and "alice" not in hers.text
    assert bob.ask("GET", "/assistants/agent").status_code == 200
    assert bob.ask("POST", "/assistants/count", body={}).json() == 2  # his own and the default

    # The empty thread (kept only in Redis) and Alice's thread in Bob's eyes and in hers.
    assert bob.ask("GET", f"/threads/{empty_id}").status_code == 404
    assert alice.ask("GET", f"/threads/{empty_id}").status_code == 200
    # A key is its user's: Bob's same Idempotency-Key is another key.
    again = bob.ask("POST", "/api/chat", body={"message": "bob's own"},
                    headers={"Idempotency-Key": "shared-key"})
    assert again.status_code == 202 and again.json()["conversation"] != conversation_id, again.text
    # An operator sees everything, with its owner.
    listed = root.ask("GET", "/api/conversations").json()["conversations"]
    assert {c["id"]: c["owner"] for c in listed}[conversation_id] == "alice"
    assert root.ask("GET", f"/api/runs/{run_id}").json()["owner"] == "alice"
    # Alice's own list has hers and not Bob's.
    own = {c["id"] for c in alice.ask("GET", "/api/conversations").json()["conversations"]}
    assert conversation_id in own and again.json()["conversation"] not in own
    # The Store: Alice's item is in her search, and Bob's own item of the same name is not hers.
    search = {"namespace_prefix": ["notes"]}
    assert "alice's secret note" in alice.ask("POST", "/store/items/search", body=search).text
    assert "alice's secret note" not in bob.ask("POST", "/store/items/search", body=search).text
