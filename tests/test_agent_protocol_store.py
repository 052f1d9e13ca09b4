"""The Store (docs/agent-protocol.md, "The Store") through the real ``langgraph-sdk`` client
(``client.store``) against a real API and worker, on SQLite and on PostgreSQL: items put, read,
replaced, searched (namespace prefix, filter, limit, offset), their namespaces listed (prefix,
suffix, max_depth, limit, offset) and deleted; each user's items their own (another's are 404
and in no search or list); what is not served refused by name with nothing changed; and the
items outlive the API process that stored them. The JavaScript SDK keeps items too. The agent
remembers and recalls in its run's owner's items, through the ledger."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_client
from langgraph_sdk.errors import NotFoundError

from tests.fakes.ollama import FakeOllama, Text, ToolCalls
from tests.support.faults import ledger_rows
from tests.support.js_sdk import run_js
from tests.support.ports import free_port
from tests.support.postgres import engine_overrides
from tests.support.redis_server import RedisServer
from tests.support.stacks import Stack, module_stack
from tests.support.users import add_user


@dataclass
class Store:
    stack: Stack
    alice: str
    bob: str
    root: str
    engine: str

    @property
    def url(self) -> str:
        return self.stack.api


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer,
    fake_ollama: FakeOllama,
) -> Iterator[Store]:
    """One worker and API per engine, with two users and an operator, for the module's tests."""
    root = tmp_path_factory.mktemp(f"store-{request.param}")
    overrides = engine_overrides(request, request.param, short_lease=False)
    with module_stack(root, redis_server.url, fake_ollama, **overrides) as stack:
        # Three CLI processes at once: each is mostly Python's start-up.
        with ThreadPoolExecutor() as pool:
            made = [("alice",), ("bob",), ("root", "--operator")]
            alice, bob, operator = pool.map(lambda who: add_user(stack.env, *who), made)
        yield Store(stack, alice, bob, operator, request.param)


def refused(url: str, key: str, method: str, path: str, **kwargs: Any) -> tuple[int, str, str]:
    answer = httpx.request(method, f"{url}{path}", headers={"x-api-key": key}, timeout=30, **kwargs)
    body = answer.json()
    return answer.status_code, body["error"]["code"], body["error"]["message"]


async def test_items_put_read_search_list_and_delete(store: Store) -> None:
    async with get_client(url=store.url, api_key=store.alice) as sdk:
        await sdk.store.put_item(["notes", "work"], "plan", {"text": "ship it", "rank": 2})
        await sdk.store.put_item(["notes", "work"], "todo", {"text": "tests", "rank": 1})
        await sdk.store.put_item(["notes", "home"], "plan", {"text": "garden", "rank": 2})
        await sdk.store.put_item(["profile"], "name", {"text": "Alice"})

        item = await sdk.store.get_item(["notes", "work"], "plan")
        assert item["namespace"] == ["notes", "work"] and item["key"] == "plan"
        assert item["value"] == {"text": "ship it", "rank": 2}
        assert item["created_at"] and item["updated_at"]
        # A put replaces the value under the same key.
        await sdk.store.put_item(["notes", "work"], "plan", {"text": "ship it today", "rank": 3})
        again = await sdk.store.get_item(["notes", "work"], "plan")
        assert again["value"]["text"] == "ship it today" and again["updated_at"] >= item["updated_at"]

        found = (await sdk.store.search_items(["notes"], limit=10))["items"]
        assert {(*i["namespace"], i["key"]) for i in found} == {
            ("notes", "work", "plan"), ("notes", "work", "todo"), ("notes", "home", "plan")}
        work = (await sdk.store.search_items(["notes", "work"]))["items"]
        assert {i["key"] for i in work} == {"plan", "todo"}
        by_rank = (await sdk.store.search_items(["notes"], filter={"rank": 2}))["items"]
        assert [(i["namespace"], i["value"]["text"]) for i in by_rank] == [(["notes", "home"], "garden")]
        # Pages: limit and offset cut the same ordering into disjoint parts.
        first = (await sdk.store.search_items(["notes"], limit=2))["items"]
        rest = (await sdk.store.search_items(["notes"], limit=2, offset=2))["items"]
        assert len(first) == 2 and len(rest) == 1
        assert {i["key"] + i["namespace"][1] for i in first + rest} == {"planwork", "todowork", "planhome"}
        # A prefix matches whole labels: "note" is not "notes".
        assert (await sdk.store.search_items(["note"]))["items"] == []

        everything = (await sdk.store.list_namespaces())["namespaces"]
        assert sorted(everything) == [["notes", "home"], ["notes", "work"], ["profile"]]
        assert sorted((await sdk.store.list_namespaces(prefix=["notes"]))["namespaces"]) == [
            ["notes", "home"], ["notes", "work"]]
        assert (await sdk.store.list_namespaces(suffix=["home"]))["namespaces"] == [["notes", "home"]]
        shallow = (await sdk.store.list_namespaces(max_depth=1))["namespaces"]
        assert sorted(shallow) == [["notes"], ["profile"]]
        paged = [(await sdk.store.list_namespaces(limit=1, offset=n))["namespaces"] for n in range(4)]
        assert sorted(p[0] for p in paged if p) == sorted(everything) and paged[3] == []

        await sdk.store.delete_item(["notes", "work"], "todo")
        with pytest.raises(NotFoundError):
            await sdk.store.get_item(["notes", "work"], "todo")
        # Deleting what is not there changes nothing and is no error, as on the Agent Server.
        await sdk.store.delete_item(["notes", "work"], "todo")
        assert {i["key"] for i in (await sdk.store.search_items(["notes", "work"]))["items"]} == {"plan"}

    if store.engine == "sqlite":  # in a file of their own beside the database
        database = store.stack.env.database_path
        assert (database.parent / f"{database.stem}.store.db").stat().st_size > 0
    # The items outlive the API process that stored them: another one reads them.
    other = store.stack.group.start_api(store.stack.env, port=free_port())
    async with get_client(url=str(other.url), api_key=store.alice) as sdk:
        assert (await sdk.store.get_item(["profile"], "name"))["value"] == {"text": "Alice"}
    other.kill()


async def test_each_users_items_are_their_own(store: Store) -> None:
    async with (get_client(url=store.url, api_key=store.alice) as alice,
                get_client(url=store.url, api_key=store.bob) as bob,
                get_client(url=store.url, api_key=store.root) as root):
        await alice.store.put_item(["secrets"], "diary", {"text": "alice's secret"})
        # Bob names the same namespace and key: nothing of Alice's is there for him.
        with pytest.raises(NotFoundError):
            await bob.store.get_item(["secrets"], "diary")
        assert (await bob.store.search_items(["secrets"]))["items"] == []
        assert (await bob.store.search_items([]))["items"] == []
        assert (await bob.store.list_namespaces())["namespaces"] == []
        await bob.store.delete_item(["secrets"], "diary")
        assert (await alice.store.get_item(["secrets"], "diary"))["value"] == {"text": "alice's secret"}
        # His own item under the same name is his, and hers stays hers.
        await bob.store.put_item(["secrets"], "diary", {"text": "bob's"})
        assert (await bob.store.get_item(["secrets"], "diary"))["value"] == {"text": "bob's"}
        assert (await alice.store.get_item(["secrets"], "diary"))["value"] == {"text": "alice's secret"}
        assert (await bob.store.list_namespaces())["namespaces"] == [["secrets"]]
        # An operator's Store is its own as well: a namespace names no owner.
        with pytest.raises(NotFoundError):
            await root.store.get_item(["secrets"], "diary")
        assert "alice's secret" not in str(await root.store.search_items([]))


@pytest.mark.parametrize(("method", "path", "kwargs", "names"), [
    ("POST", "/store/items/search", {"json": {"namespace_prefix": ["a"], "query": "about gardens"}}, "query"),
    ("PUT", "/store/items", {"json": {"namespace": ["a"], "key": "k", "value": {}, "ttl": 5}}, "ttl"),
    ("PUT", "/store/items", {"json": {"namespace": ["a"], "key": "k", "value": {}, "index": ["t"]}}, "index"),
    ("PUT", "/store/items", {"json": {"namespace": ["a.b"], "key": "k", "value": {}}}, "'.'"),
    ("PUT", "/store/items", {"json": {"namespace": [], "key": "k", "value": {}}}, "namespace"),
    ("PUT", "/store/items", {"json": {"namespace": ["a", "*"], "key": "k", "value": {}}}, "'*'"),
    ("PUT", "/store/items", {"json": {"namespace": ["a"], "key": "", "value": {}}}, "key"),
    ("PUT", "/store/items", {"json": {"namespace": ["a"], "key": "k", "value": "text"}}, "value"),
    ("GET", "/store/items", {"params": {"namespace": "", "key": "k"}}, "namespace"),
    ("POST", "/store/items/search", {"json": {"namespace_prefix": ["a"], "limit": 0}}, "limit"),
    ("POST", "/store/items/search", {"json": {"filter": {"rank": {"$near": 1}}}}, "$near"),
    ("POST", "/store/namespaces", {"json": {"max_depth": 0}}, "max_depth"),
    ("POST", "/store/namespaces", {"json": {"offset": -1}}, "offset"),
], ids=["query", "ttl", "index", "dotted-label", "no-namespace", "star-label", "no-key", "value-not-object",
        "get-no-namespace", "limit", "filter-operator", "max-depth", "offset"])
def test_what_is_not_served_is_refused_by_name(
    store: Store, method: str, path: str, kwargs: dict[str, Any], names: str,
) -> None:
    status, code, message = refused(store.url, store.alice, method, path, **kwargs)
    assert status == 422 and code in ("BAD_REQUEST", "VALIDATION_ERROR") and names in message, message
    # Nothing was stored by a refused put.
    listed = httpx.post(f"{store.url}/store/items/search", json={"namespace_prefix": ["a"]},
                        headers={"x-api-key": store.alice}, timeout=30).json()
    assert listed == {"items": []}


async def test_the_agent_remembers_and_recalls_in_its_owners_store(
    store: Store, fake_ollama: FakeOllama,
) -> None:
    """The agent's ``store__remember`` and ``store__recall``: the run's owner's items, through the
    ledger like any tool call, read back over HTTP by their owner and by no one else."""
    said = {"messages": [{"role": "user", "content": "remember my tea"}]}
    async with (get_client(url=store.url, api_key=store.alice) as alice,
                get_client(url=store.url, api_key=store.bob) as bob):
        fake_ollama.script(ToolCalls([("store__remember", {"key": "tea", "text": "green, no sugar"})]),
                           Text("Noted."))
        thread = await alice.threads.create()
        await alice.runs.wait(thread["thread_id"], "agent", input=said)
        assert (await alice.store.get_item(["memories"], "tea"))["value"] == {"text": "green, no sugar"}
        with pytest.raises(NotFoundError):
            await bob.store.get_item(["memories"], "tea")
        rows = ledger_rows(store.stack.env, thread["thread_id"])
        assert [(r["tool"], r["state"]) for r in rows] == [("store__remember", "done")], rows

        # A later conversation of hers recalls it; one of Bob's recalls nothing of hers.
        answers = []
        for sdk in (alice, bob):
            fake_ollama.script(ToolCalls([("store__recall", {})]), Text("Recalled."))
            other = await sdk.threads.create()
            values = await sdk.runs.wait(other["thread_id"], "agent", input=said)
            assert isinstance(values, dict)
            answers.append(next(m["content"] for m in values["messages"] if m["type"] == "tool"))
        assert answers == ["tea: green, no sugar", "Nothing remembered yet."]


async def test_the_javascript_sdk_keeps_items(store: Store) -> None:
    out = await run_js("store_items.mjs", store.url, store.alice)
    item = out["item"]
    assert item["namespace"] == ["js", "notes"] and item["value"] == {"text": "from node", "rank": 1}
    assert item["created_at"] and item["updated_at"]
    assert [(i["key"], i["value"]["text"]) for i in out["found"]["items"]] == [("second", "also from node")]
    assert out["listed"] == {"namespaces": [["js", "notes"]]}
    assert out["gone"] == {"status": 404}
