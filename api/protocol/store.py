"""The Store through the Agent Protocol: ``client.store.put_item``, ``get_item``, ``delete_item``,
``search_items`` and ``list_namespaces`` (docs/agent-protocol.md, "The Store").

Long-term memory that outlives a thread, on LangGraph's own ``BaseStore`` for the engine
(shared/storage/memory.py). Each identity's items are its own: every namespace the caller names
is stored under the caller's label and shown without it (api/auth/scope.py), so another user's
items are absent (404, and in no search or list of namespaces). What the Agent Server does with
an embedding model, vector search (``query``, ``index`` fields), and item ``ttl`` are refused
by name: Sophos configures neither.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

import msgspec
from litestar import Controller, delete, get, post, put
from litestar.datastructures import State
from litestar.di import Provide
from litestar.params import Parameter

from api.auth.scope import store_namespace, store_namespace_shown
from api.http.openapi import errors
from api.resources import Resources
from shared.errors import BadRequest, DatabaseUnavailable, NotFound
from shared.storage.memory import LazyItemStore, unreachable

TAGS = ["agent protocol"]
#: the most a search or a list of namespaces answers at once
PAGE_MAX = 1000
NO_VECTORS = "(Sophos configures no embedding model for the Store: docs/agent-protocol.md)"


class PutItem(msgspec.Struct):
    """Body of ``PUT /store/items``: what ``client.store.put_item`` sends."""

    namespace: list[str]
    key: str
    value: dict[str, Any]
    index: bool | list[str] | None = None
    ttl: float | None = None


class ItemRef(msgspec.Struct):
    """Body of ``DELETE /store/items``."""

    namespace: list[str]
    key: str


class SearchItems(msgspec.Struct):
    """Body of ``POST /store/items/search``."""

    namespace_prefix: list[str] = msgspec.field(default_factory=list)
    filter: dict[str, Any] | None = None
    limit: int = 10
    offset: int = 0
    query: str | None = None
    refresh_ttl: bool | None = None


class ListNamespaces(msgspec.Struct):
    """Body of ``POST /store/namespaces``."""

    prefix: list[str] | None = None
    suffix: list[str] | None = None
    max_depth: int | None = None
    limit: int = 100
    offset: int = 0


def _labels(namespace: Sequence[str], what: str, *, wildcard: bool = False) -> tuple[str, ...]:
    """The caller's namespace, checked as LangGraph checks it, so a bad one is a 422 naming it."""
    for label in namespace:
        if not label or "." in label or "\x00" in label:
            raise BadRequest(
                f"{what} {list(namespace)!r}: a label must be a non-empty string without '.'"
            )
        if label == "*" and not wildcard:
            raise BadRequest(f"{what} {list(namespace)!r}: '*' matches any label, so it cannot name one")
    return tuple(namespace)


def _page(limit: int, offset: int) -> None:
    if not 1 <= limit <= PAGE_MAX:
        raise BadRequest(f"limit must be between 1 and {PAGE_MAX}, got {limit}")
    if offset < 0:
        raise BadRequest(f"offset must be 0 or more, got {offset}")


def _item(item: Any) -> dict[str, Any]:
    """The SDK's ``Item`` (and ``SearchItem``, with its ``score``), its namespace as the owner named it."""
    shown = {
        "namespace": store_namespace_shown(item.namespace), "key": item.key, "value": item.value,
        "created_at": item.created_at.isoformat(), "updated_at": item.updated_at.isoformat(),
    }
    if hasattr(item, "score"):
        shown["score"] = item.score
    return shown


class ItemStore:
    """The caller's items, on the process's one Store."""

    def __init__(self, store: LazyItemStore) -> None:
        self._store = store

    async def _call(self, op: str, *args: Any, **kwargs: Any) -> Any:
        from langgraph.store.base import InvalidNamespaceError

        try:
            store = await self._store.get()
            return await getattr(store, op)(*args, **kwargs)
        except InvalidNamespaceError as exc:
            raise BadRequest(str(exc)) from exc
        except unreachable() as exc:
            raise DatabaseUnavailable(f"the Store's database cannot be reached ({type(exc).__name__}); "
                                      "try again") from exc

    async def put(self, body: PutItem) -> None:
        namespace = _labels(body.namespace, "namespace")
        if not namespace:
            raise BadRequest("namespace must name at least one label")
        if not body.key:
            raise BadRequest("key must not be empty")
        if isinstance(body.index, list) or body.index is True:
            raise BadRequest(f"index is not served: items are not embedded for vector search {NO_VECTORS}")
        if body.ttl is not None:
            raise BadRequest("ttl is not served: an item is kept until it is deleted")
        await self._call("aput", store_namespace(namespace), body.key, body.value)

    async def get(self, namespace: str, key: str) -> dict[str, Any]:
        labels = _labels(namespace.split(".") if namespace else [], "namespace")
        if not labels or not key:
            raise BadRequest("namespace (labels joined by '.') and key are both required")
        item = await self._call("aget", store_namespace(labels), key)
        if item is None:
            raise NotFound(f"no item {key!r} in namespace {list(labels)!r}")
        return _item(item)

    async def delete(self, body: ItemRef) -> None:
        labels = _labels(body.namespace, "namespace")
        if not labels or not body.key:
            raise BadRequest("namespace and key are both required")
        await self._call("adelete", store_namespace(labels), body.key)

    async def search(self, body: SearchItems) -> dict[str, Any]:
        if body.query is not None:
            raise BadRequest(f"query is not served: there is no vector search {NO_VECTORS}; "
                             "search by namespace_prefix and filter")
        _page(body.limit, body.offset)
        prefix = _labels(body.namespace_prefix, "namespace_prefix")
        try:
            found = await self._call("asearch", store_namespace(prefix), filter=body.filter,
                                     limit=body.limit, offset=body.offset)
        except ValueError as exc:  # an operator the filter does not know
            raise BadRequest(f"filter: {exc}") from exc
        return {"items": [_item(item) for item in found]}

    async def namespaces(self, body: ListNamespaces) -> dict[str, Any]:
        _page(body.limit, body.offset)
        if body.max_depth is not None and body.max_depth < 1:
            raise BadRequest(f"max_depth must be 1 or more, got {body.max_depth}")
        prefix = _labels(body.prefix or [], "prefix", wildcard=True)
        suffix = _labels(body.suffix, "suffix", wildcard=True) if body.suffix else None
        found = await self._call(
            "alist_namespaces", prefix=store_namespace(prefix), suffix=suffix,
            # the owner's label is one more level than the caller sees
            max_depth=None if body.max_depth is None else body.max_depth + 1,
            limit=body.limit, offset=body.offset,
        )
        return {"namespaces": [store_namespace_shown(ns) for ns in found]}


def _item_store(state: State) -> ItemStore:
    resources: Resources = state.resources
    return ItemStore(resources.item_store)


Namespace = Annotated[str, Parameter(description="The item's namespace: its labels joined by '.'")]
Key = Annotated[str, Parameter(description="The item's key in its namespace")]
RefreshTtl = Annotated[bool | None, Parameter(description="Changes nothing: items have no TTL")]


DEPENDENCIES = {"items": Provide(_item_store, sync_to_thread=False)}


class StoreController(Controller):
    path = "/store"
    tags = TAGS
    dependencies = DEPENDENCIES

    @put("/items", status_code=204, summary="Store or replace one of the caller's items",
         responses=errors(401, 422, 503))
    async def put_item(self, data: PutItem, items: ItemStore) -> None:
        await items.put(data)

    @get("/items", summary="One of the caller's items", responses=errors(401, 404, 422, 503))
    async def get_item(
        self, items: ItemStore, namespace: Namespace, key: Key, refresh_ttl: RefreshTtl = None,
    ) -> dict[str, Any]:
        return await items.get(namespace, key)

    @delete("/items", status_code=204, summary="Delete one of the caller's items (none: nothing changes)",
            responses=errors(401, 422, 503))
    async def delete_item(self, data: ItemRef, items: ItemStore) -> None:
        await items.delete(data)

    @post("/items/search", status_code=200, summary="The caller's items under a namespace prefix",
          responses=errors(401, 422, 503))
    async def search_items(self, data: SearchItems, items: ItemStore) -> dict[str, Any]:
        return await items.search(data)

    @post("/namespaces", status_code=200, summary="The caller's namespaces", responses=errors(401, 422, 503))
    async def list_namespaces(self, data: ListNamespaces, items: ItemStore) -> dict[str, Any]:
        return await items.namespaces(data)

