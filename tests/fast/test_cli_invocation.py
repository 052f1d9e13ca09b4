"""How the client names itself in the commands it prints (sophos_cli/invocation.py), and what
``sophos runs`` prints from an answer of the API (sophos_cli/commands.py)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from sophos_cli import commands
from sophos_cli.invocation import Invocation, options_of, program_of


def test_the_launcher_says_how_it_was_typed() -> None:
    main = "/x/sophos_cli/__main__.py"
    assert program_of(main, ["python3"], {"SOPHOS_PROGRAM": "./sophos"}, None) == "./sophos"
    assert program_of(main, ["python3"], {"SOPHOS_PROGRAM": "my dir/sophos"}, None) == "'my dir/sophos'"


def test_python_dash_m_names_the_interpreter_as_typed() -> None:
    assert program_of("/x/sophos_cli/__main__.py", [".venv/bin/python", "-m", "sophos_cli"], {}, None) \
        == ".venv/bin/python -m sophos_cli"


def test_the_console_script_is_sophos_when_it_is_the_one_on_path(tmp_path: Path) -> None:
    script = tmp_path / "bin" / "sophos"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\n")
    other = tmp_path / "other" / "sophos"
    other.parent.mkdir()
    other.write_text("#!/bin/sh\n")
    assert program_of(str(script), ["python3", str(script)], {}, str(script)) == "sophos"
    assert program_of(str(script), ["python3", str(script)], {}, str(other)) == str(script)
    assert program_of(str(script), ["python3", str(script)], {}, None) == str(script)


def test_url_and_token_given_are_given_again() -> None:
    hint = Invocation("./sophos", options_of("http://h:1", "t0k")).command("approve", "abc")
    assert hint == "./sophos approve abc --url http://h:1 --token t0k"
    default = Invocation().command("chat", "--resume", "--conversation", "c")
    assert default == "sophos chat --resume --conversation c"
    assert options_of(None, None) == ()


class _Listing:
    """``Api.runs`` answering from a fixed list, as ``GET /api/runs`` would: positions from 0."""

    def __init__(self, runs: list[dict[str, Any]]) -> None:
        self._runs = runs

    def runs(self, status: str | None = None, **_: Any) -> dict[str, Any]:
        return {"runs": [run for run in self._runs if run["status"] == status], "worker": None}


def test_runs_counts_queue_places_from_1_as_chat_does(capsys: pytest.CaptureFixture[str]) -> None:
    queued = [
        {"status": "queued", "id": f"r{position}", "conversation": "c", "position": position, "waitedMs": 5}
        for position in (1, 0)
    ]
    args = argparse.Namespace(status=None, conversation=None, limit=20)
    assert commands.runs(_Listing(queued), args) == 0  # type: ignore[arg-type]  # only .runs is used
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [(row[1], row[3]) for row in rows] == [("r0", "#1"), ("r1", "#2")]
