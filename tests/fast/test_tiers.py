"""How ``./sophos test`` reads its arguments (tests/support/tiers.py)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from tests.support import tiers


@pytest.mark.parametrize(
    ("args", "plain"),
    [
        ([], False),
        (["-q", "--durations=25"], False),
        (["-q", "--durations", "25"], False),  # an option's value is not a path
        (["-x", "-m", "fault"], False),
        (["--version"], True),
        (["--collect-only", "-q"], True),
        (["tests/test_chat.py", "-x"], True),
        (["tests/fast/test_tiers.py::test_a_marker_expression_narrows_each_tier"], True),
        (["tests"], True),
    ],
)
def test_options_alone_run_the_tiers_and_a_path_or_a_no_run_option_runs_plain_pytest(
    args: list[str], plain: bool
) -> None:
    assert tiers.plain(args) is plain


def test_a_marker_expression_narrows_each_tier() -> None:
    assert tiers.split_marker(["-q", "-m", "fault or slow", "-x"]) == ("fault or slow", ["-q", "-x"])
    assert tiers.split_marker(["-mslow"]) == ("slow", [])
    assert tiers.split_marker(["--markers"]) == (None, ["--markers"])
    assert tiers.narrowed("not fast", "fault or slow") == "not fast and (fault or slow)"
    assert tiers.narrowed("fast", None) == "fast"


def test_the_workers_are_ours_unless_the_arguments_choose_them() -> None:
    ours = ["-n", str(tiers.DEFAULT_WORKERS), "--dist", "loadgroup"]
    assert tiers.worker_options(["-q"], {}) == ours
    assert tiers.worker_options(["-q"], {tiers.WORKERS_VARIABLE: "5"})[:2] == ["-n", "5"]
    assert tiers.worker_options(["-q"], {tiers.WORKERS_VARIABLE: "0"}) == []
    for given in (["-n", "2"], ["-n2"], ["--numprocesses=2"], ["--dist", "load"]):
        assert tiers.worker_options(given, {}) == []
    with pytest.raises(SystemExit, match=tiers.WORKERS_VARIABLE):
        tiers.worker_options([], {tiers.WORKERS_VARIABLE: "many"})


def test_every_module_with_a_module_scoped_stack_runs_in_one_worker() -> None:
    """A module-scoped fixture (a stack, a browser, a built wheel) spread over xdist workers is
    started once per worker: its module must be in ONE_WORKER_MODULES (tests/conftest.py)."""
    from tests.conftest import ONE_WORKER_MODULES

    shared = {
        path.name for path in tiers.ROOT.joinpath("tests").glob("test_*.py")
        if 'scope="module"' in path.read_text()
    }
    assert shared, "no module-scoped fixture found: the check reads the wrong folder"
    assert shared <= ONE_WORKER_MODULES, sorted(shared - ONE_WORKER_MODULES)


def test_the_fast_tier_collects_its_folder_the_files_named_and_the_files_that_mark_a_test_fast(
    tmp_path: Path,
) -> None:
    (tmp_path / "fast").mkdir()
    named = next(iter(tiers.FAST_ELSEWHERE))
    (tmp_path / named).write_text("def test_pure(): pass\n")
    marked = f"import pytest\n\n@pytest.{tiers.FAST_MARK}\ndef test_x(): pass\n"
    (tmp_path / "test_marked.py").write_text(marked)
    (tmp_path / "test_processes.py").write_text("def test_y(sophos_env): pass\n")
    assert [p.name for p in tiers.fast_files(tmp_path)] == ["fast", *sorted([named, "test_marked.py"])]
    # The real tree: the tier's folder first, every file of FAST_ELSEWHERE among the rest.
    found = tiers.fast_files()
    assert found[0] == tiers.FAST_DIR and {p.name for p in found} >= set(tiers.FAST_ELSEWHERE)


def test_every_test_has_a_timeout(pytestconfig: pytest.Config) -> None:
    """A hung test fails after ten minutes (pytest-timeout, pyproject.toml) instead of holding CI."""
    assert pytestconfig.pluginmanager.hasplugin("timeout")
    assert float(pytestconfig.getini("timeout")) == 600


def test_the_projects_modules_are_compiled_once_before_the_tiers(tmp_path: Path) -> None:
    """Every process a test starts reads the project's bytecode instead of compiling its sources
    (no process writes it where PYTHONDONTWRITEBYTECODE is set, as on the CI machine)."""
    from tests.support.tiers import compiled

    (tmp_path / "worker").mkdir()
    (tmp_path / "worker" / "mod.py").write_text("X = 1\n")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "mod.py").write_text("X = 1\n")
    compiled(tmp_path)
    assert list((tmp_path / "worker" / "__pycache__").glob("mod.*.pyc"))
    assert not (tmp_path / "elsewhere" / "__pycache__").exists()


def test_only_the_plugins_the_tests_use_are_loaded() -> None:
    """Entry-point plugins are not loaded (nor their packages' modules rewritten: langsmith's, anyio's
    and schemathesis's were, in every pytest process); the ones the tests use are named."""
    config = tomllib.loads((tiers.ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    options = config["addopts"].split()
    assert "--disable-plugin-autoload" in options
    named = {options[i + 1] for i, option in enumerate(options) if option == "-p"}
    assert named == {"xdist", "asyncio", "timeout", "hypothesispytest", "schemathesis"}
