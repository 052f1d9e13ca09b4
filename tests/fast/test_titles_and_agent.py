"""Pure parts of renaming, title search and the agent the heartbeat describes: no process."""

from __future__ import annotations

import json

import pytest
from langchain_core.tools import StructuredTool

from api.conversations.renaming import clean_title
from api.conversations.title_search import matches, pattern
from shared.errors import InvalidTitle
from shared.redis.liveness import ToolInfo, parse_beat
from worker.resources import TOOL_DESCRIPTION_CHARS, tool_list


def test_a_title_has_its_whitespace_collapsed_and_is_refused_blank_or_too_long() -> None:
    assert clean_title("  Trip\n\tto   Lisbon ") == "Trip to Lisbon"
    assert clean_title("x" * 200) == "x" * 200
    for bad, words in (
        ("", "empty"), (" \n ", "empty"), ("x" * 201, "at most 200 characters, got 201"),
        ("a\x00b", "control characters"), ("bell\x07", "control characters"),
    ):
        with pytest.raises(InvalidTitle, match=words):
            clean_title(bad)


def test_a_search_escapes_like_wildcards_and_folds_case_where_the_engine_does_not() -> None:
    assert pattern("100%_a\\b", "postgresql") == "%100\\%\\_a\\\\b%"
    assert pattern("ÉCOLE", "sqlite") == "%école%"  # SQLite folds both sides with sophos_fold
    assert pattern("ÉCOLE", "postgresql") == "%ÉCOLE%"  # ILIKE folds
    assert matches("École d'été", "ÉCOLE") and matches("Budget 100%", "0%")
    assert not matches("snake_case", "a_e")


def test_the_beat_names_the_model_and_the_tools_and_an_older_beat_names_none() -> None:
    beat = parse_beat(json.dumps({
        "started_at": 1.0, "beat_at": 2.0, "model": "qwen3",
        "tools": [{"name": "tools__add", "description": "Add two integers."}, "not a tool"],
    }))
    assert beat is not None
    assert (beat.model, beat.tools) == ("qwen3", (ToolInfo("tools__add", "Add two integers."),))
    older = parse_beat(json.dumps({"started_at": 1.0, "beat_at": 2.0}))
    assert older is not None and (older.model, older.tools) == (None, ())


def test_a_tool_is_described_by_the_first_line_of_its_description_cut_short() -> None:
    def tool(name: str, description: str) -> StructuredTool:
        return StructuredTool.from_function(lambda: "", name=name, description=description)

    listed = tool_list([tool("a__one", "  First line.\nMore detail."), tool("a__two", "y" * 500)])
    assert listed == [
        {"name": "a__one", "description": "First line."},
        {"name": "a__two", "description": "y" * TOOL_DESCRIPTION_CHARS},
    ]
