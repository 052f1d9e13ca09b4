"""Small helpers that document routes in the OpenAPI document: error answers, path parameters."""

from __future__ import annotations

from http import HTTPStatus
from typing import Annotated

from litestar.openapi import ResponseSpec
from litestar.params import Parameter

from api.http.schemas import ErrorBody


def errors(*statuses: int) -> dict[int, ResponseSpec]:
    """``{status: ResponseSpec(ErrorBody)}`` for each status a route can answer with."""
    return {
        status: ResponseSpec(data_container=ErrorBody, description=HTTPStatus(status).phrase)
        for status in statuses
    }


#: A conversation id in a path, described once for every route that takes one.
ConversationId = Annotated[str, Parameter(description="The conversation's id (a UUID)")]
#: A run id in a path.
RunId = Annotated[str, Parameter(description="The run's id (a UUID)")]
