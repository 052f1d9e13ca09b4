"""The error envelope every 4xx and 5xx answer carries."""

from __future__ import annotations

import msgspec


class ErrorDetail(msgspec.Struct):
    code: str
    message: str


class ErrorBody(msgspec.Struct):
    error: ErrorDetail
