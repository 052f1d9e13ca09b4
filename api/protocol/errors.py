"""The protocol's error answers: Sophos's envelope, with the Agent Server's ``detail`` beside it.

``{"error": {"code", "message"}, "detail": message}``: the SDKs read either. Status codes are
the Agent Server's: a request it would call invalid (a malformed id, a body it cannot take) is
422 where the native routes say 400; the rest (404, 409, 413, 429, 503) are the native ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from litestar import Request, Response
from litestar.types import ExceptionHandlersMap

from api.http.errors import exception_handlers

Handler = Callable[[Request[Any, Any, Any], Any], Response[Any]]


def _with_detail(handler: Handler) -> Handler:
    def handle(request: Request[Any, Any, Any], exc: Any) -> Response[Any]:
        response = handler(request, exc)
        body = response.content
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            body["detail"] = body["error"].get("message")
        if response.status_code == 400:
            response.status_code = 422
        return response

    return handle


def protocol_exception_handlers() -> ExceptionHandlersMap:
    return {kind: _with_detail(handler) for kind, handler in exception_handlers().items()}
