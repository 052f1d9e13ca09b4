"""The API process's resources, opened and closed once by the app's lifespan.

Nothing here connects eagerly: the API starts while Redis is down or before the
worker has created the database, and answers 503 for what needs them.
"""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

import httpx
import structlog
from litestar import Litestar
from redis.asyncio import Redis

from api.auth.guard import Authenticator
from api.auth.keys import KeyDirectory
from api.auth.oidc import OidcVerifier
from api.chat.feed import Feeds
from api.chat.submit import ChatService
from api.conversations.views import Conversations
from api.runs.views import Runs
from api.store import Store, open_store
from shared.redis.connection import connection_kwargs, retry_policy
from shared.settings import Settings
from shared.speedups import Speedups, in_use
from shared.storage.engines import open_item_store
from shared.storage.memory import LazyItemStore

log = structlog.get_logger(__name__)

REDIS_CONNECT_SECONDS = 2.0
REDIS_ATTEMPTS = 3


class LazyClient:
    """The API's HTTP client, made on first use: an httpx client's TLS context alone holds ~2 MB
    (the CA bundle), which an API that nothing probes and no OIDC issuer guards never uses (bench
    figure 16)."""

    def __init__(self) -> None:
        self._client: httpx.AsyncClient | None = None

    @property
    def made(self) -> bool:
        return self._client is not None

    def get(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient()
        return self._client

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()


@dataclass(frozen=True, slots=True)
class Resources:
    settings: Settings
    redis: Redis
    store: Store
    #: the model's readiness probe and an OIDC issuer's keys (made on first use)
    http: LazyClient
    #: set when the server begins to shut down: open event streams end promptly
    draining: threading.Event
    #: one reader per watched run, shared by its event streams
    feeds: Feeds
    chat: ChatService
    conversations: Conversations
    runs: Runs
    #: who is asking (api/auth/guard.py)
    auth: Authenticator
    #: the Store's items (api/protocol/store.py), opened on first use
    item_store: LazyItemStore


def redis_client(settings: Settings) -> Redis:
    """A lazily connecting client; its socket timeout outlasts one SSE XREAD BLOCK.

    Few retries, unlike the worker's: enough to replace pooled connections that a
    Redis restart closed, short enough to answer 503 promptly while Redis is down.
    """
    return Redis.from_url(
        settings.redis_url,
        **{**connection_kwargs(), "retry": retry_policy(REDIS_ATTEMPTS)},
        decode_responses=True,
        socket_connect_timeout=REDIS_CONNECT_SECONDS,
        socket_timeout=settings.sse_ping_interval + 10.0,
        # Named, so CLIENT LIST tells each API process's connections apart.
        client_name=f"sophos-api-{os.getpid()}",
        parser_class=Speedups.of(settings).parser_class(),
    )


@asynccontextmanager
async def open_resources(settings: Settings, draining: threading.Event) -> AsyncIterator[Resources]:
    async with AsyncExitStack() as stack:
        redis = redis_client(settings)
        stack.push_async_callback(redis.aclose)
        store = open_store(settings)
        stack.push_async_callback(store.close)
        store.open()
        http = LazyClient()
        stack.push_async_callback(http.aclose)
        feeds = Feeds(redis)
        stack.push_async_callback(feeds.aclose)
        item_store = LazyItemStore(lambda: open_item_store(settings))
        stack.push_async_callback(item_store.close)
        yield Resources(
            settings=settings,
            redis=redis,
            store=store,
            http=http,
            draining=draining,
            feeds=feeds,
            chat=ChatService(settings, store, redis),
            conversations=Conversations(store, redis),
            runs=Runs(store, redis, settings),
            auth=Authenticator(
                settings, KeyDirectory(store.db),
                OidcVerifier(settings, http.get) if settings.auth_oidc_issuer is not None else None,
            ),
            item_store=item_store,
        )


def lifespan(
    settings: Settings, draining: threading.Event
) -> Callable[[Litestar], AbstractAsyncContextManager[None]]:
    """The app's lifespan: open the resources, put them in ``app.state``, close them."""

    @asynccontextmanager
    async def run(app: Litestar) -> AsyncIterator[None]:
        async with open_resources(settings, draining) as resources:
            app.state.resources = resources
            log.info(
                "api.started", database=settings.database_name, token=settings.api_token is not None,
                oidc=settings.auth_oidc_issuer,
                **in_use(resources.redis), http=Speedups.of(settings).api_http,
            )
            try:
                yield
            finally:
                log.info("api.stopping")

    return run
