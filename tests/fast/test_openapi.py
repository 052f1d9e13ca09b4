"""The API document a newcomer reads at /schema: every operation tagged, every parameter described."""

from __future__ import annotations

from typing import Any

from api.app import create_app
from shared.settings import Settings

TAGS = {"chat", "conversations", "runs", "operations", "agent protocol"}


def _operations() -> list[tuple[str, str, dict[str, Any]]]:
    schema = create_app(Settings()).openapi_schema.to_schema()
    return [
        (method.upper(), path, operation)
        for path, item in schema["paths"].items()
        for method, operation in item.items()
        if isinstance(operation, dict) and "responses" in operation
    ]


def test_every_operation_is_grouped_by_a_tag() -> None:
    operations = _operations()
    assert len(operations) >= 12
    for method, path, operation in operations:
        assert operation.get("tags") and set(operation["tags"]) <= TAGS, (method, path, operation.get("tags"))
    assert {tag for *_, operation in operations for tag in operation["tags"]} == TAGS


def test_every_parameter_carries_a_description() -> None:
    for method, path, operation in _operations():
        for parameter in operation.get("parameters", []):
            assert parameter.get("description"), (method, path, parameter["name"])


def test_a_runs_breakdown_is_described() -> None:
    schemas = create_app(Settings()).openapi_schema.to_schema()["components"]["schemas"]
    assert "description" in schemas["RunInfo"]["properties"]["breakdown"]
    parts = schemas["RunBreakdown"]["properties"]
    assert set(parts) == {"queuedMs", "modelMs", "toolsMs", "databaseMs"}
    assert all(part["description"].startswith("Milliseconds ") for part in parts.values())
