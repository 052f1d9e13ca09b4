"""How the client names itself in the commands it prints (sophos_cli/invocation.py)."""

from __future__ import annotations

from pathlib import Path

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
