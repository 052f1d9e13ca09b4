"""The Litestar application: routes under /api, one error mapping, OpenAPI at /schema."""

from __future__ import annotations

import threading

from litestar import Litestar, Router
from litestar.config.cors import CORSConfig
from litestar.datastructures import State
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig
from litestar.openapi.spec import Components, SecurityScheme

from api import web
from api.auth import routes as auth_routes
from api.auth.guard import identify
from api.chat import routes as chat_routes
from api.conversations import routes as conversation_routes
from api.http.access_log import access_log
from api.http.errors import exception_handlers
from api.http.limits import StreamLimit, SubmissionLimit
from api.ops import pruning as ops_pruning
from api.ops import routes as ops_routes
from api.protocol.errors import protocol_exception_handlers
from api.protocol.mcp_mount import McpMount
from api.protocol.routes import ROUTES as PROTOCOL_ROUTES
from api.protocol.runs.stateless import ROUTES as STATELESS_ROUTES
from api.protocol.threads.prune import ROUTES as PRUNE_ROUTES
from api.protocol.threads.updates import ROUTES as UPDATE_ROUTES
from api.resources import Resources, lifespan
from api.runs import routes as run_routes
from shared import compat
from shared.settings import Settings


def _resources(state: State) -> Resources:
    resources: Resources = state.resources
    return resources


def cors_config(settings: Settings) -> CORSConfig | None:
    """CORS for the origins of CORS_ORIGINS only; None (same origin only) when there are none.

    Litestar's middleware runs before routing: it answers a preflight ``OPTIONS`` itself
    (no guard sees it, so no token is needed for it), and adds the headers to every answer
    to a listed origin, errors included, so a page can read why it was refused.
    """
    if not settings.cors_origins:
        return None
    return CORSConfig(
        allow_origins=list(settings.cors_origins),
        # PATCH, x-api-key, Location and Content-Location: the Agent Protocol's (a thread's
        # update, the SDKs' key, where to rejoin a run's stream), for the JavaScript SDK in a page.
        allow_methods=["GET", "POST", "PATCH", "DELETE", "OPTIONS"],
        allow_headers=["Authorization", "Content-Type", "Idempotency-Key", "Last-Event-ID", "x-api-key"],
        expose_headers=["Retry-After", "Location", "Content-Location"],
        allow_credentials=False,  # the token travels in a header, never in a cookie
    )


def create_app(settings: Settings, *, draining: threading.Event | None = None) -> Litestar:
    """Build the API for ``settings``; resources are opened by the app's lifespan.

    ``draining``, once set (by the server, on SIGTERM), makes open event streams end
    cleanly so their clients reconnect elsewhere; it is also ``app.state.draining``.
    """
    draining = draining if draining is not None else threading.Event()
    api = Router(
        path="/api",
        route_handlers=[
            chat_routes.post_chat,
            chat_routes.stream_chat,
            chat_routes.switch_branch,
            conversation_routes.list_conversations,
            conversation_routes.get_conversation,
            conversation_routes.delete_conversation,
            conversation_routes.rename_conversation,
            conversation_routes.export_conversation,
            run_routes.list_runs,
            run_routes.get_run,
            run_routes.cancel,
            ops_routes.agent,
            ops_routes.healthz,
            ops_routes.readyz,
            ops_pruning.prune_checkpoints,
            ops_pruning.prune_progress,
            auth_routes.whoami,
            auth_routes.signin,
        ],
        guards=[identify],
        security=[{"bearer": []}],
    )
    # Prometheus scrapes the root, as an operator (api/ops/routes.py).
    scrape = Router(
        path="/", route_handlers=[ops_routes.scrape], guards=[identify], security=[{"bearer": []}]
    )
    # The Agent Protocol (api/protocol/), at the root paths the LangGraph SDKs use, behind the
    # same guard: the SDKs present a key as x-api-key, a JWT as a bearer token.
    # The agent as an MCP server at /mcp (api/protocol/mcp.py): mounted there, behind the same guard,
    # loaded on its first request (api/protocol/mcp_mount.py).
    mcp = McpMount(settings.max_body_bytes)
    protocol = Router(
        path="/",
        route_handlers=[*PROTOCOL_ROUTES, *STATELESS_ROUTES, *UPDATE_ROUTES, *PRUNE_ROUTES, mcp.route],
        guards=[identify],
        security=[{"bearer": []}],
        exception_handlers=protocol_exception_handlers(),
    )
    components = [Components(security_schemes={"bearer": SecurityScheme(type="http", scheme="bearer")})]
    openapi = OpenAPIConfig(
        title="Sophos",
        version="0.1.0",
        description="A durable chat agent: send messages, stream a run's events, read conversations.",
        path="/schema",
        render_plugins=web.schema_viewers(),  # served from web/vendor: works offline
        components=components,
    )
    # Litestar but pydantic's plugin: the API has no pydantic model (~7 MB: bench figure 16).
    return compat.litestar_without_pydantic()(
        route_handlers=[api, scrape, protocol, *web.routes(settings)],  # the page at / (api/web.py)
        lifespan=[lifespan(settings, draining), mcp.lifespan],
        state=State(
            {"draining": draining, "submission_limit": SubmissionLimit(settings.rate_limit_per_minute)}
        ),
        dependencies={"resources": Provide(_resources, sync_to_thread=False)},
        exception_handlers=exception_handlers(),
        cors_config=cors_config(settings),
        middleware=[access_log, StreamLimit(settings.max_streams_per_client).middleware],
        request_max_body_size=settings.max_body_bytes,
        openapi_config=openapi,
        logging_config=None,
        debug=False,
    )
