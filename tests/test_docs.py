"""The manual (docs/, mkdocs.yml) and its front page (README.md) hold together.

``mkdocs build --strict`` (the ``docs`` extra; CI installs it) fails on a broken link, a
missing page or a page left out of the navigation. The checks before it need nothing but the
files: every relative link of the README and of the manual names a file that exists, every
page is in the navigation, and the README stays a front page that reaches a streamed answer.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
#: [text](target) and ![alt](target), outside code spans and blocks (stripped first)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def prose(markdown: str) -> str:
    """The text without fenced blocks and code spans, where brackets are code, not links."""
    without_blocks = re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", without_blocks)


def local_links(path: Path) -> list[tuple[str, Path]]:
    """Each relative link of a Markdown file and the file it names (anchors dropped)."""
    found = []
    for target in LINK.findall(prose(path.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # http:, mailto:, or an anchor of this page
        found.append((target, (path.parent / target.split("#", 1)[0]).resolve()))
    return found


def nav_pages(nav: list[object]) -> list[str]:
    pages: list[str] = []
    for entry in nav:
        values = entry.values() if isinstance(entry, dict) else [entry]
        for value in values:
            pages.extend(nav_pages(value) if isinstance(value, list) else [str(value)])
    return pages


def test_every_relative_link_names_a_file() -> None:
    for path in [README, *sorted(DOCS.glob("*.md"))]:
        for target, resolved in local_links(path):
            assert resolved.exists(), f"{path.relative_to(ROOT)}: {target}"


def test_every_page_is_in_the_navigation() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    listed = nav_pages(config["nav"])
    pages = sorted(p.name for p in DOCS.glob("*.md"))
    assert sorted(listed) == pages
    assert config["theme"]["name"] == "material"


def test_the_readme_is_a_front_page() -> None:
    """About 150 lines: what Sophos is, the two commands, what you see (curl included), links on."""
    text = README.read_text()
    assert len(text.splitlines()) <= 170
    for command in ('./sophos up', './sophos chat "hello"'):
        assert command in text
    # curl right where it is offered: a message posted, its events streamed.
    assert "curl -s -XPOST" in text and "curl -sN" in text
    linked = {resolved for _target, resolved in local_links(README)}
    for page in ("getting-started.md", "api.md", "cli.md", "web.md", "crash-semantics.md", "security.md",
                 "deployment.md", "contributing.md"):
        assert (DOCS / page).resolve() in linked, page
    # Benchmark figures live in bench/RESULTS.md alone: linked, not copied.
    assert "bench/RESULTS.md" in text and "runs/s" not in text


def test_the_first_run_is_described_with_its_size() -> None:
    page = (DOCS / "getting-started.md").read_text()
    assert re.search(r"\| runtime only \(`\./sophos up`, `\./sophos chat`\) \| \d+ MB \|", page), page
    assert re.search(r"\| with the test extras \(`\./sophos test`\) \| \d+ MB \|", page), page
    launcher = (ROOT / "sophos").read_text()
    # The launcher installs the runtime alone unless it was asked for the tests.
    assert '-e "$target"' in launcher and 'target="."' in launcher and 'target=".[test]"' in launcher


def test_the_benchmark_page_shows_the_one_results_file() -> None:
    page = (DOCS / "benchmarks.md").read_text()
    assert '--8<-- "bench/RESULTS.md"' in page
    assert (ROOT / "bench" / "RESULTS.md").is_file()


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None,
                    reason='the docs extra: pip install -c requirements.lock -e ".[docs]" (CI installs it)')
def test_mkdocs_builds_the_manual_strictly(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={"NO_MKDOCS_2_WARNING": "1",
                                                                     "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "crash-semantics" / "index.html").is_file()
    # The benchmark's figures, included from bench/RESULTS.md at build time.
    assert "Sophos benchmark results" in (tmp_path / "site" / "benchmarks" / "index.html").read_text()


def test_docs_leads_to_the_api_document() -> None:
    """``GET /docs``, where people look first, answers: a redirect to ``/schema`` (Swagger UI).

    A route of the page's (api/web.py), public like the page and ``/schema``."""
    from litestar import Litestar
    from litestar.testing import TestClient

    from api import web
    from shared.settings import Settings

    with TestClient(Litestar(route_handlers=web.routes(Settings()))) as client:
        answer = client.get("/docs", follow_redirects=False)
    assert answer.status_code in (302, 307), answer.text
    assert answer.headers["location"] == "/schema"


@pytest.mark.fast
def test_the_tool_call_promise_is_stated_and_never_weakened_to_at_least_once() -> None:
    """README and the crash table say what the kill-point matrix proves (tests/test_kill_points.py);
    no page promises only at-least-once."""
    promise = "a tool call that finished never runs again; one that may have run is asked about"
    table = (DOCS / "crash-semantics.md").read_text()
    assert promise in README.read_text().lower()
    assert promise in table.lower()
    row = "| worker `kill -9` at each point of a tool"
    rows = [line for line in table.splitlines() if line.startswith(row)]
    assert len(rows) == 1
    for point in ("before its intent", "while the tool server executes", "after its result",
                  "after its outcome", "after the step's checkpoint"):
        assert point in rows[0], point
    tasks_row = "| worker `kill -9` at each point of a call made as an MCP task"
    [tasks] = [line for line in table.splitlines() if line.startswith(tasks_row)]
    for point in ("after the server made the task, before its id is committed", "while the task works",
                  "after the task completed, before the call's outcome is recorded"):
        assert point in tasks, point
    for path in [README, *sorted(DOCS.glob("*.md"))]:
        text = re.sub(r"\s+", " ", path.read_text().lower())
        assert "at-least-once" not in text and "at least once" not in text, path.name
