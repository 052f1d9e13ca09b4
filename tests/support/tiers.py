"""``./sophos test``: the fast tier first, then the real-process tiers, in parallel.

    python -m tests.support.tiers [pytest options]

1. The fast tier, ``-m fast``: tests/fast/, the pure tests of other files named in
   :data:`FAST_ELSEWHERE` (tests/conftest.py marks them) and any test marked ``fast``:
   pure logic, no process, in one pytest process. If it fails, nothing else runs. It collects
   only the files that can hold such a test (:func:`fast_files`): collecting every module
   (the real-process ones, tests/test_fuzz.py building its cases) took half its time.
2. The real-process tests, ``-m "not fast and not alone"``, spread over
   ``SOPHOS_TEST_WORKERS`` xdist workers (default :data:`DEFAULT_WORKERS`; ``0`` runs them
   in one process) with ``--dist loadgroup``: a module that shares a server or a browser
   between its tests runs in one worker (``ONE_WORKER_MODULES`` and
   ``pytest_xdist_make_scheduler``, tests/conftest.py).
3. The timing-bound tests, ``-m alone`` (:data:`ALONE`): they assert latencies, which the
   other workers' load would distort, so they run last, one at a time, in one process.

Options (``-q``, ``--durations=25``, ``-x``, ``-m EXPR``, …) go to both tiers; ``-m EXPR``
narrows each (``fast and (EXPR)``, ``not fast and (EXPR)``). Pass ``-n`` to choose the
workers yourself. With a path or node id (``tests/test_chat.py::test_x``), or an option
that runs no tests (``--version``, ``--help``, ``--collect-only``, ``--fixtures``,
``--markers``), the arguments go to one plain pytest as they are, in this process:
no tiers, no workers. A tier with no test to run (pytest's exit 5) is not a failure.
"""

from __future__ import annotations

import compileall
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

#: Workers for the real-process tiers on the 2-core CI machine: each test waits on processes,
#: signals and deadlines, so more workers than cores keep both cores busy (the tier has no idle
#: time on 4; docs/contributing.md).
DEFAULT_WORKERS = 4
WORKERS_VARIABLE = "SOPHOS_TEST_WORKERS"
NO_TESTS_COLLECTED = 5  # pytest.ExitCode.NO_TESTS_COLLECTED
ROOT = Path(__file__).resolve().parent.parent.parent
FAST_DIR = ROOT / "tests" / "fast"

#: Pure tests in files that are mostly real-process ones (file name -> test names): they
#: join the fast tier (tests/conftest.py marks them). A new pure test goes to tests/fast/, or is
#: marked ``@pytest.mark.fast`` in its file.
FAST_ELSEWHERE: dict[str, frozenset[str]] = {
    "test_cors.py": frozenset({"test_origins_are_checked_and_normalized"}),
    "test_damaged_startup.py": frozenset({"test_whether_a_run_was_checkpointed_is_told_without_decoding"}),
    "test_deploy.py": frozenset({
        "test_compose_file_parses_with_its_services_and_volumes",
        "test_only_the_worker_mounts_the_database_read_write",
        "test_config_is_mounted_not_baked_into_the_image",
        "test_the_image_runs_as_a_user_that_owns_the_data_dirs",
        "test_memory_server_is_pinned_to_one_exact_version",
        "test_the_stores_items_are_on_a_volume_the_api_and_the_worker_both_write",
        "test_postgres_runs_only_under_its_profile_with_a_health_check",
        "test_the_default_deployment_is_sqlite_without_postgres",
        "test_the_postgres_override_points_worker_and_api_at_postgres",
        "test_the_worker_can_be_scaled",
    }),
    "test_fakes.py": frozenset({"test_split_tokens_keeps_the_text"}),
    "test_launcher.py": frozenset({
        "test_backoff_doubles_to_thirty_seconds_and_starts_over_after_a_stable_run",
        "test_the_launcher_reads_its_settings_through_settings",
    }),
    "test_redis_protocol.py": frozenset({"test_the_scripts_end_a_run_only_through_the_one_lua_ending"}),
    "test_security.py": frozenset({"test_every_dependency_is_pinned_by_the_lock"}),
    "test_settings.py": frozenset({
        "test_defaults_and_overrides",
        "test_database_url_picks_postgresql_and_hides_its_password",
        "test_bad_value_names_the_variable",
        "test_speedups_auto_takes_the_fast_one_and_a_missing_one_is_refused",
        "test_msgspec_codec_parses_the_same_as_json",
    }),
    "test_storage.py": frozenset({"test_the_api_reads_threads_with_the_workers_graph_shape"}),
}


#: Tests that assert how fast something answers (file name -> test names): the ``alone`` tier.
ALONE: dict[str, frozenset[str]] = {
    "test_events.py": frozenset({
        "test_relay_latency_from_publish_to_sse_client",
        "test_200_subscribers_on_one_process_all_receive_every_event",
        "test_frozen_client_is_dropped_and_costs_no_one_anything",
    }),
    "test_storage.py": frozenset({
        "test_exporting_a_long_conversation_does_not_hold_up_another_clients_events",
    }),
    "test_api_hardening.py": frozenset({
        "test_reads_in_flight_survive_the_database_vanishing_and_coming_back",
    }),
    # a run's duration in the metrics within 2 ms of the one its row's timestamps give
    "test_operators.py": frozenset({"test_metrics_parse_and_match_the_runs_listing"}),
    # the page says a killed worker is gone within 2 s of the API knowing it (a poll a second):
    # once failed beside other suites' load, never alone
    "test_web.py": frozenset({"test_a_killed_worker_shows_within_two_seconds_and_resume_gives_one_answer"}),
}

#: How a test file outside tests/fast/ marks a test of its own ``fast`` (decorator or ``pytestmark``).
FAST_MARK = "mark.fast"


def fast_files(tests: Path = FAST_DIR.parent) -> list[Path]:
    """The files the fast tier collects: tests/fast/, the files of :data:`FAST_ELSEWHERE`, and every
    other test file that says :data:`FAST_MARK`. tests/conftest.py refuses a fast test elsewhere, so
    none is left out of both tiers."""
    named = {tests / name for name in FAST_ELSEWHERE}
    marked = {path for path in tests.glob("test_*.py") if FAST_MARK in path.read_text()}
    return [tests / FAST_DIR.name, *sorted(path for path in named | marked if path.exists())]


#: Options after which pytest runs no test: passed through as they are.
_NO_RUN = {"--version", "-V", "-h", "--help", "--co", "--collect-only", "--fixtures", "--funcargs",
           "--fixtures-per-test", "--markers", "--setup-plan"}
_WORKER_OPTIONS = ("-n", "--numprocesses", "--dist", "-d", "--tx")


def _is_selection(arg: str) -> bool:
    """A path or node id (``tests/x.py::test_y``), as opposed to an option or its value."""
    if arg.startswith("-"):
        return False
    return (ROOT / arg.split("::", 1)[0]).exists() or Path(arg.split("::", 1)[0]).exists()


def plain(args: Sequence[str]) -> bool:
    """Whether ``args`` go to one plain pytest instead of the tiers."""
    return any(a in _NO_RUN or _is_selection(a) for a in args)


def split_marker(args: Sequence[str]) -> tuple[str | None, list[str]]:
    """The ``-m`` expression among ``args`` (the last one, as pytest takes it) and the rest."""
    expression: str | None = None
    rest: list[str] = []
    items = iter(args)
    for arg in items:
        if arg == "-m":
            expression = next(items, "")
        elif arg.startswith("-m") and not arg.startswith("--"):
            expression = arg[2:].removeprefix("=")
        else:
            rest.append(arg)
    return expression, rest


def narrowed(tier: str, expression: str | None) -> str:
    return tier if not expression else f"{tier} and ({expression})"


def worker_options(args: Sequence[str], environ: dict[str, str] | os._Environ[str]) -> list[str]:
    """xdist's options for the real-process tiers (none if ``args`` choose their own)."""
    if any(a == o or a.startswith(o + "=") or (o == "-n" and a.startswith("-n")) for a in args
           for o in _WORKER_OPTIONS):
        return []
    raw = environ.get(WORKERS_VARIABLE, "").strip()
    try:
        count = int(raw) if raw else DEFAULT_WORKERS
    except ValueError:
        raise SystemExit(f"sophos test: {WORKERS_VARIABLE} must be a number, got {raw!r}") from None
    if count <= 0:
        return []
    return ["-n", str(count), "--dist", "loadgroup"]


#: The project's packages, compiled once before the tiers (:func:`compiled`).
PACKAGES = ("api", "worker", "shared", "sophos_cli", "bench", "scripts", "tests")


def compiled(root: Path = ROOT) -> None:
    """Write the bytecode of the project's own modules once, before any test starts a process.

    With ``PYTHONDONTWRITEBYTECODE`` set (as on the CI machine) no process writes it, so every
    worker, API, reader and CLI the tests start (about a thousand) compiled the modules it
    imports from source: about 0.3 s of CPU each, on a tier that is CPU-bound. The installed
    packages are compiled at install (``--compile-bytecode``, ./sophos). A module edited later is
    recompiled by whoever imports it, as always (the bytecode records its source's time and size).
    """
    for package in PACKAGES:
        if (root / package).is_dir():
            compileall.compile_dir(root / package, quiet=1)


def _pytest(args: Sequence[str]) -> int:
    # pytest caches its rewritten test modules only where bytecode may be written.
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return subprocess.call([sys.executable, "-m", "pytest", *args], cwd=ROOT, env=environ)


def run_tiers(args: Sequence[str]) -> int:
    compiled()
    expression, rest = split_marker(args)
    tiers = [
        ("fast tier (pure logic, no process)",
         ["-m", narrowed("fast", expression), *(str(p.relative_to(ROOT)) for p in fast_files())]),
        ("real-process tiers", ["-m", narrowed("not fast and not alone", expression),
                                *worker_options(rest, os.environ)]),
    ]
    files = [FAST_DIR.parent / name for name in sorted(ALONE)]
    alone = [str(p.relative_to(ROOT)) for p in files if p.exists()]
    if alone:  # only their files collected
        tiers.append(("timing-bound tests, one at a time", ["-m", narrowed("alone", expression), *alone]))
    for title, options in tiers:
        print(f"sophos test: {title}: pytest {' '.join([*options, *rest])}", file=sys.stderr, flush=True)
        started = time.monotonic()
        code = _pytest([*options, *rest])
        print(f"sophos test: {title}: exit {code} in {time.monotonic() - started:.0f}s",
              file=sys.stderr, flush=True)
        if code not in (0, NO_TESTS_COLLECTED):
            return code
    return 0


def main(argv: Sequence[str]) -> int:
    if plain(argv):
        os.chdir(ROOT)
        os.execv(sys.executable, [sys.executable, "-m", "pytest", *argv])  # noqa: S606 - our own pytest
    try:
        return run_tiers(argv)
    except KeyboardInterrupt:  # Ctrl-C reached pytest too, which has reported and stopped
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
