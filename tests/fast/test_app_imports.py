"""What the API's process imports with its app: not pydantic (issue 45, bench figure 16).

Litestar adds pydantic's plugin to every app whenever pydantic is installed (it is, for LangGraph),
importing pydantic with it (~7 MB a process); the API has no pydantic model (its types are
msgspec's), so its app is made without that plugin (shared/compat.py ``litestar_without_pydantic``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar

from api.app import create_app
from shared import compat
from shared.settings import Settings

ROOT = Path(__file__).resolve().parents[2]

#: What ``python -m api`` imports (api/__main__.py), then its app made.
_API = """
import sys
import uvicorn
from api.app import create_app
from api.auth.bearer import exposure_problem
from api.http.parser import MAX_HEADER_BYTES, protocol
from shared import tracing
from shared.logging import configure_logging
from shared.settings import Settings
from shared.speedups import Speedups
create_app(Settings())
print(sorted(sys.modules))
"""


def test_the_apis_process_loads_no_pydantic_nor_langgraph() -> None:
    loaded = subprocess.run(
        [sys.executable, "-c", _API], capture_output=True, text=True, check=True, cwd=ROOT,
    ).stdout
    found = [
        m for m in eval(loaded)  # noqa: S307
        if m.startswith(("pydantic", "litestar.plugins.pydantic", "langgraph", "langchain_core", "mcp"))
    ]
    assert "litestar" in loaded and not found, found


def test_without_pydantics_plugin_the_app_documents_the_same_api(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pydantic's plugin has nothing to do in this app: the OpenAPI document is the same with it
    (but for the examples, made up at random each time)."""
    without = create_app(Settings()).openapi_schema.to_schema()
    monkeypatch.setattr(compat, "litestar_without_pydantic", lambda: Litestar)
    app = create_app(Settings())
    assert any(type(p).__name__ == "PydanticPlugin" for p in app.plugins)
    assert _without_examples(app.openapi_schema.to_schema()) == _without_examples(without)


def _without_examples(value: Any) -> Any:
    """A document without its examples: Litestar makes them up at random (polyfactory)."""
    if isinstance(value, dict):
        return {k: _without_examples(v) for k, v in value.items() if k != "examples"}
    if isinstance(value, list):
        return [_without_examples(v) for v in value]
    return value
