"""Every failure becomes ``{"error": {"code", "message"}}``: the one place errors meet HTTP."""

from __future__ import annotations

from typing import Any

import msgspec
import structlog
from litestar import MediaType, Request, Response
from litestar.exceptions import HTTPException, ValidationException
from litestar.types import ExceptionHandlersMap
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from api.ops.readiness import NotReadyError
from shared.errors import QueueUnavailable, RateLimited, SophosError, Unauthorized

log = structlog.get_logger(__name__)

#: Litestar's HTTP errors by status, as the contract names them.
HTTP_CODES = {
    400: "BAD_REQUEST",
    401: "UNAUTHORIZED",
    403: "FORBIDDEN",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    406: "NOT_ACCEPTABLE",
    413: "PAYLOAD_TOO_LARGE",
    415: "UNSUPPORTED_MEDIA_TYPE",
    429: "RATE_LIMITED",
    500: "INTERNAL_ERROR",
    503: "SERVICE_UNAVAILABLE",
}


def envelope(code: str, message: str, status: int, headers: dict[str, str] | None = None) -> Response[Any]:
    return Response(
        {"error": {"code": code, "message": message}},
        status_code=status,
        media_type=MediaType.JSON,
        headers=headers,
    )


def _sophos_error(request: Request[Any, Any, Any], exc: SophosError) -> Response[Any]:
    if exc.status >= 500:
        log.warning("request.unavailable", code=exc.code, error=exc.message)
    headers = {"WWW-Authenticate": 'Bearer realm="sophos"'} if isinstance(exc, Unauthorized) else None
    if isinstance(exc, RateLimited) and exc.retry_after is not None:
        headers = {"Retry-After": str(exc.retry_after)}
    response = envelope(exc.code, exc.message, exc.status, headers)
    if isinstance(exc, NotReadyError):
        response.content["checks"] = msgspec.to_builtins(exc.checks)
        if exc.worker is not None:
            response.content["worker"] = msgspec.to_builtins(exc.worker)
    return response


def _validation_message(exc: ValidationException) -> str:
    problems = []
    for item in exc.extra if isinstance(exc.extra, list) else []:
        if isinstance(item, dict):
            key, message = item.get("key"), item.get("message")
            problems.append(f"{key}: {message}" if key and key != "data" else str(message))
    return "; ".join(problems) or str(exc.detail)


def _http_message(request: Request[Any, Any, Any], exc: HTTPException) -> str:
    status = exc.status_code
    if status == 404:
        return f"no such resource: {request.url.path}"
    if status == 405:
        return f"method {request.method} is not allowed on {request.url.path}"
    if status == 413:
        limit = request.app.request_max_body_size
        return f"request body is larger than {limit} bytes" if limit else "request body is too large"
    if isinstance(exc, ValidationException):
        return _validation_message(exc)
    return str(exc.detail)


def _http_error(request: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    status = exc.status_code
    code = HTTP_CODES.get(status, "BAD_REQUEST" if status < 500 else "INTERNAL_ERROR")
    return envelope(code, _http_message(request, exc), status, headers=exc.headers)


def _redis_down(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    log.warning("request.redis_unavailable", error=str(exc))
    # The detail (host, port) stays in the log.
    error = QueueUnavailable("the queue is unavailable, try again shortly")
    return envelope(error.code, error.message, error.status)


def _unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    log.exception("request.failed", method=request.method, path=request.url.path)
    return envelope("INTERNAL_ERROR", "internal error", 500)


def exception_handlers() -> ExceptionHandlersMap:
    return {
        SophosError: _sophos_error,
        HTTPException: _http_error,
        RedisConnectionError: _redis_down,
        RedisTimeoutError: _redis_down,
        Exception: _unexpected,
    }
