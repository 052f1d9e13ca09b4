"""The web page: ``GET /`` and its files under ``/web/``; the ``/schema`` viewer served from them;
``GET /docs``, where people look for an API's documentation, leads to ``/schema``.

The page is plain HTML, CSS and ES modules in the repository's ``web/`` folder (no
build step). Third-party files are vendored in ``web/vendor/`` by
``scripts/vendor-web.sh``, so neither the page nor the API documentation fetches
anything from a CDN: both work on a machine with no internet.

The page is same-origin with the API, so the browser guard (api/auth/bearer.py) lets its
requests through, and it needs no CORS. Its own files are public like ``/schema``:
they hold no data, and the page must load before it can ask for a token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from litestar import Response, Router, get
from litestar.enums import MediaType
from litestar.openapi.plugins import OpenAPIRenderPlugin, SwaggerRenderPlugin
from litestar.response import Redirect
from litestar.static_files import create_static_files_router

from shared.settings import Settings

#: Model text is untrusted: even if a reply slipped past the renderer, the browser would
#: run no inline script, load nothing from elsewhere and send nothing elsewhere.
PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
        "frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

_VIEWER = "/web/vendor/swagger-ui-dist"


def web_dir() -> Path:
    """The folder holding ``index.html``: ``web/`` beside the packages (a checkout, an
    editable install, or the installed wheel, which holds it as package data: the image),
    else the working directory's."""
    candidates = (Path(__file__).resolve().parent.parent / "web", Path.cwd() / "web")
    for candidate in candidates:
        if (candidate / "index.html").is_file():
            return candidate
    return candidates[0]


def page_headers(settings: Settings) -> dict[str, str]:
    """:data:`PAGE_HEADERS`, the page's sign-in provider let in: the page fetches its discovery
    document and its token endpoint (``AUTH_OIDC_PAGE_CLIENT``, web/js/signin.js)."""
    if settings.auth_oidc_issuer is None or settings.auth_oidc_page_client is None:
        return PAGE_HEADERS
    issuer = urlsplit(settings.auth_oidc_issuer)
    policy = PAGE_HEADERS["Content-Security-Policy"].replace(
        "connect-src 'self'", f"connect-src 'self' {issuer.scheme}://{issuer.netloc}"
    )
    return {**PAGE_HEADERS, "Content-Security-Policy": policy}


def routes(settings: Settings) -> list[Any]:
    """``GET /`` (the page), ``/web/*`` (its files) and ``/docs``, left out of the OpenAPI document."""
    folder = web_dir()
    headers = page_headers(settings)

    def with_page_headers(response: Response[Any]) -> Response[Any]:
        response.headers.update(headers)
        return response

    @get("/docs", include_in_schema=False, sync_to_thread=False)
    def docs() -> Redirect:
        # The manual is docs/ in the repository; the API's own document is /schema.
        return Redirect("/schema")

    @get("/", include_in_schema=False, media_type=MediaType.HTML, sync_to_thread=False)
    def page() -> Response[bytes]:
        # Read per request: the file is small, and an edit shows on reload.
        return Response((folder / "index.html").read_bytes(), media_type=MediaType.HTML, headers=headers)

    files: Router = create_static_files_router(
        path="/web", directories=[folder], name="web", include_in_schema=False,
        after_request=with_page_headers,
    )
    return [page, docs, files]


def schema_viewers() -> list[OpenAPIRenderPlugin]:
    """Swagger UI at ``/schema`` from the vendored files (``/schema/openapi.json`` stays)."""
    return [
        SwaggerRenderPlugin(
            path="/",
            js_url=f"{_VIEWER}/swagger-ui-bundle.js",
            css_url=f"{_VIEWER}/swagger-ui.css",
            standalone_preset_js_url=f"{_VIEWER}/swagger-ui-standalone-preset.js",
            # Litestar's default favicon is an image on a CDN.
            favicon="<link rel='icon' href='data:,'>",
        )
    ]
