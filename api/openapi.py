"""Small helpers that document routes' error answers in the OpenAPI document."""

from __future__ import annotations

from http import HTTPStatus

from litestar.openapi import ResponseSpec

from api.schemas import ErrorBody


def errors(*statuses: int) -> dict[int, ResponseSpec]:
    """``{status: ResponseSpec(ErrorBody)}`` for each status a route can answer with."""
    return {
        status: ResponseSpec(data_container=ErrorBody, description=HTTPStatus(status).phrase)
        for status in statuses
    }
