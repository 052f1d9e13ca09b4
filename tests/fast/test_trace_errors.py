"""A span that ends on an exception says its type, never its text (shared/tracing.py)."""

from __future__ import annotations

from typing import Any

import pytest

from shared import tracing


class _Span:
    def __init__(self) -> None:
        self.recorded: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: self.recorded.append((name, args, kwargs))


@pytest.mark.fast
def test_a_failed_span_carries_the_error_type_and_no_exception_text() -> None:
    pytest.importorskip("opentelemetry.trace")
    span = _Span()
    secret = "Bearer tok-123 for https://crm.example/mcp?key=abc"
    tracing._ended(span, ConnectionError(secret))
    assert secret not in repr(span.recorded) and "tok-123" not in repr(span.recorded)
    assert ("set_attributes", ({"error.type": "ConnectionError"},), {}) in span.recorded
