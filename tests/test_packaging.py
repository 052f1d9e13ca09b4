"""The wheel holds together: built from a copy of this tree, installed outside it, every module imported.

The image installs the package into site-packages and runs it from there, so a package or
subpackage the wheel leaves out (``shared.storage`` once was) fails here rather than in a
container whose working directory happened to hold the sources. The build needs no network
(``--no-build-isolation``: the venv's setuptools) when that setuptools can build a wheel;
otherwise pip fetches the build backend pyproject.toml names (or takes it from its cache).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("api", "worker", "shared", "sophos_cli")
#: what the wheel's copy of the tree leaves out: environments, data, caches, build output
NOT_SOURCES = shutil.ignore_patterns(".git", ".venv*", "data", "node_modules", "__pycache__", "build",
                                     "dist", "*.egg-info", "site", ".coverage*", ".mypy_cache",
                                     ".ruff_cache", ".pytest_cache", "tests", "bench")


def source_modules() -> list[str]:
    """Every module of the service's packages in this checkout, as dotted names."""
    names = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            names.append(".".join(parts))
    return names


def can_build_offline() -> bool:
    """The venv's setuptools builds wheels: 70.1 and later by itself, older ones with ``wheel``."""
    try:
        from importlib.metadata import version

        major, minor = (int(part) for part in version("setuptools").split(".")[:2])
    except Exception:  # not installed (Python 3.12's venvs have none) or an odd version
        return False
    return (major, minor) >= (70, 1) or importlib.util.find_spec("wheel") is not None


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from a copy of the tree and installed with ``pip --target`` into a folder."""
    base = tmp_path_factory.mktemp("wheel")
    source = base / "source"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCES)
    isolation = ["--no-build-isolation"] if can_build_offline() else []
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run([*pip, "wheel", "--no-deps", *isolation, "--wheel-dir", str(base / "dist"), str(source)],
                   check=True, cwd=base, timeout=600)
    (wheel,) = (base / "dist").glob("sophos-*.whl")
    target = base / "site"
    subprocess.run([*pip, "install", "--no-deps", "--no-compile", "--target", str(target), str(wheel)],
                   check=True, cwd=base, timeout=600)
    return target


def run_installed(target: Path, args: list[str], cwd: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    """A command with the installed folder first on the path and the venv's packages after it."""
    env = {**os.environ, "PYTHONPATH": str(target), "PYTHONSAFEPATH": "1", **extra}
    env.pop("COVERAGE_PROCESS_START", None)  # coverage measures the checkout, not this copy
    return subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


def test_every_module_imports_from_the_installed_wheel(installed: Path, tmp_path: Path) -> None:
    modules = source_modules()
    assert "shared.storage.postgres" in modules and "sophos_cli.entry" in modules
    script = (
        "import importlib, sys\n"
        "target = sys.argv[1]\n"
        "for name in sys.argv[2:]:\n"
        "    module = importlib.import_module(name)\n"
        "    assert module.__file__.startswith(target), (name, module.__file__)\n"
        "print('imported', len(sys.argv) - 2)\n"
    )
    done = run_installed(installed, [sys.executable, "-c", script, str(installed), *modules], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"imported {len(modules)}"


def test_the_wheel_holds_the_page_beside_the_packages(installed: Path, tmp_path: Path) -> None:
    """api/web.py finds web/ beside its package: the installed API serves the page from anywhere."""
    assert (installed / "web" / "index.html").is_file()
    for name in ("style.css", "js/chat.js", "vendor/marked/marked.esm.js",
                 "vendor/highlightjs/highlight.min.js", "vendor/swagger-ui-dist/swagger-ui-bundle.js"):
        assert (installed / "web" / name).is_file(), name
    script = "from api.web import web_dir; print(web_dir())"
    done = run_installed(installed, [sys.executable, "-c", script], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()) == installed / "web"


def test_the_sophos_console_script_runs_the_commands_as_printed(installed: Path, tmp_path: Path) -> None:
    """``sophos approve ID`` and the like, as the CLI prints them; ``sophos worker``/``api`` too."""
    with zipfile.ZipFile(next((installed.parent / "dist").glob("sophos-*.whl"))) as wheel:
        entry_points = next(n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt"))
        assert "sophos = sophos_cli.entry:main" in wheel.read(entry_points).decode()
    script = installed / "bin" / "sophos"
    assert script.is_file()
    helped = run_installed(installed, [sys.executable, str(script), "--help"], cwd=tmp_path)
    assert helped.returncode == 0, helped.stderr
    for command in ("chat", "conversations", "approve", "cancel", "worker", "api"):
        assert command in helped.stdout
    # No API at this address: the client says so (exit 3), as `sophos conversations` would.
    listed = run_installed(installed, [sys.executable, str(script), "conversations",
                                       "--url", "http://127.0.0.1:9"], cwd=tmp_path)
    assert listed.returncode == 3, listed.stderr
    assert "is the API running" in listed.stderr
    # The worker's own check, through the console script: no Redis at this address (exit 2).
    checked = run_installed(installed, [sys.executable, str(script), "worker", "--check"], cwd=tmp_path,
                            REDIS_URL="redis://127.0.0.1:9/0")
    assert checked.returncode == 2, checked.stdout + checked.stderr
    up = run_installed(installed, [sys.executable, str(script), "up"], cwd=tmp_path)
    assert up.returncode == 2 and "./sophos up" in up.stderr


# --- the launcher's first run: runtime dependencies only, the test extras on the first `test` ----

_STUB_PYTHON = """#!/usr/bin/env bash
# Stands in for python3 and the venv's python: records each call, makes the venv's folder.
echo "$(basename "$(dirname "$(dirname "$0")")")/$(basename "$0") $*" >> "$STUB_LOG"
if [ "$1" = -m ] && [ "$2" = venv ]; then mkdir -p "$3/bin" && cp "$0" "$3/bin/python"; fi
if [ "$1" = -c ]; then case "$2" in *readabilipy*) echo "$STUB_JSDIR" ;; esac; fi
exit 0
"""


def test_the_launcher_installs_the_test_extras_only_for_test(tmp_path: Path) -> None:
    """``./sophos chat`` makes a lean .venv (``-e .``); the first ``./sophos test`` adds
    ``.[test]``, once; each install says what it does on stderr. (pip itself is a stub here.)"""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    shutil.copy(ROOT / "sophos", checkout / "sophos")
    for name in ("pyproject.toml", "requirements.lock"):
        shutil.copy(ROOT / name, checkout / name)
    stub = tmp_path / "bin" / "python3"
    stub.parent.mkdir()
    stub.write_text(_STUB_PYTHON)
    stub.chmod(0o755)
    jsdir = tmp_path / "readabilipy-js"
    (jsdir / "node_modules").mkdir(parents=True)  # as if npm had run: nothing to install
    log = tmp_path / "calls.log"
    env = {**os.environ, "PYTHON": str(stub), "STUB_LOG": str(log), "STUB_JSDIR": str(jsdir)}

    def launch(*args: str) -> tuple[str, list[str]]:
        log.write_text("")
        done = subprocess.run([str(checkout / "sophos"), *args], env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        # The launcher installs with uv (``python -m uv pip install``), else with pip.
        locked = [line for line in log.read_text().splitlines()
                  if (" -m pip install" in line or " -m uv pip install" in line)
                  and "-c requirements.lock " in line]
        return done.stderr, [line.split("-c requirements.lock ", 1)[1] for line in locked]

    said, installs = launch("chat", "--help")
    assert "sophos: creating .venv: installing the runtime dependencies" in said
    assert "sophos: .venv is ready" in said
    assert installs == ["-e ."]
    said, installs = launch("up", "--help")
    assert said == "" and installs == []  # made once
    said, installs = launch("test", "--version")
    assert "sophos: updating .venv: installing the dependencies and the test extras" in said
    assert installs == ["-e .[test]"]
    said, installs = launch("test", "--version")
    assert said == "" and installs == []
