"""agent-chat-ui's build, for the browser tests (tests/test_agent_chat_ui.py, served by
tests/support/chat_ui.py). Standard library only, so ``.ci/run`` can start it before the
test environment exists: ``python3 -m tests.support.chat_ui_build``.

The UI is LangChain's published release: ``create-agent-chat-app`` 0.1.6, whose
``templates/nextjs`` is agent-chat-ui (a Next.js app). The build fetches that tarball with
``npm pack`` from npm's configured registry and checks it against the integrity pinned here,
removes the one import that reaches the internet at build time (``next/font/google`` in
``src/app/layout.tsx``), installs the dependencies from the lockfile committed in
tests/agent_chat_ui/ (``npm ci``) and runs ``next build``. The built app is kept in a cache
outside the checkout (``SOPHOS_TEST_CACHE``, else ``~/.cache/sophos-tests``), keyed by the
release and the lockfile, whole or not at all: a machine pays the build once.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from tests.support.cache import INSTALL_TIMEOUT, cache_root

RELEASE = "create-agent-chat-app@0.1.6"
#: ``dist.integrity`` of the release, as the registry published it
INTEGRITY = "sha512-FmiAY3/1QHsScsfMRAtQBS9ljKvMDlG0yzgYhYiOgacSzO4cF755zJ4i/xCIpyaG/nnuW0HeAIOZgIgSVrfOEQ=="
TEMPLATE = "package/templates/nextjs/"
SOURCE = Path(__file__).resolve().parent.parent / "agent_chat_ui"
#: what the set-up writes over the template: its dependencies, pinned by the lockfile
FILES = ("package.json", "package-lock.json")
#: the Google Fonts import and its use, which ``next build`` would download
FONT_EDITS = (
    ('import { Inter } from "next/font/google";\n', ""),
    ('const inter = Inter({\n  subsets: ["latin"],\n  preload: true,\n  display: "swap",\n});\n\n', ""),
    ("<body className={inter.className}>", "<body>"),
)
BUILD_TIMEOUT = 600.0
ENV = {**os.environ, "NEXT_TELEMETRY_DISABLED": "1"}


def _key() -> str:
    digest = hashlib.sha256(RELEASE.encode())
    for name in FILES:
        digest.update(b"\0" + name.encode() + b"\0" + (SOURCE / name).read_bytes())
    digest.update(repr(FONT_EDITS).encode())
    return digest.hexdigest()[:12]


class Unavailable(Exception):
    """What the build needs is missing (node, npm, or npm's registry): the tests are skipped."""


class BuildFailed(Exception):
    """The build itself failed: the tests fail."""


def _run(args: list[str], cwd: Path, timeout: float, what: str, *, skip: bool) -> str:
    """Run ``args``; if it fails, raise :class:`Unavailable` (``skip``: npm could not reach its
    registry) or :class:`BuildFailed`."""
    outcome = _raise(Unavailable if skip else BuildFailed)
    try:
        done = subprocess.run(
            args, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False, env=ENV
        )
    except subprocess.TimeoutExpired:
        outcome(f"{what} did not finish within {timeout:.0f} s")
    if done.returncode != 0:
        said = " ".join((done.stderr or done.stdout).split())[-600:]
        outcome(f"{what} failed: {said}")
    return done.stdout


def _unpack(staging: Path) -> Path:
    """The release's tarball, fetched and checked, its template extracted: the app's folder."""
    out = _run(["npm", "pack", RELEASE, "--json", "--pack-destination", str(staging), "--fetch-retries=1",
                "--fetch-timeout=20000"], staging, INSTALL_TIMEOUT, f"npm pack {RELEASE}", skip=True)
    tarball = staging / json.loads(out)[0]["filename"]
    got = "sha512-" + base64.b64encode(hashlib.sha512(tarball.read_bytes()).digest()).decode()
    if got != INTEGRITY:
        raise BuildFailed(f"{RELEASE} from the registry is not the release pinned: {got} != {INTEGRITY}")
    app = staging / "app"
    with tarfile.open(tarball) as archive:
        members = [m for m in archive.getmembers() if m.name.startswith(TEMPLATE) and m.name != TEMPLATE]
        for member in members:
            member.name = member.name.removeprefix(TEMPLATE)
        archive.extractall(app, members=members, filter="data")
    return app


def _without_google_fonts(app: Path) -> None:
    layout = app / "src" / "app" / "layout.tsx"
    text = layout.read_text()
    for old, new in FONT_EDITS:
        if old not in text:
            raise BuildFailed(f"{layout.name} no longer holds {old.strip()!r}: the font edit needs a look")
        text = text.replace(old, new)
    layout.write_text(text)


def build() -> Path:
    """The folder of the built app (``.next``, ``node_modules``), built now if it is not yet
    (:class:`Unavailable` if node, npm or the registry is missing; :class:`BuildFailed`)."""
    for program in ("node", "npm"):
        if shutil.which(program) is None:
            raise Unavailable(f"{program} is not on PATH: the agent-chat-ui tests need node and npm")
    target = cache_root() / f"agent-chat-ui-{RELEASE.rsplit('@', 1)[1]}-{_key()}"
    if (target / ".next" / "BUILD_ID").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # One build at a time on a machine: .ci/run starts one early, beside the checks, and a test
    # that comes meanwhile waits for it here instead of building a second time.
    with open(target.parent / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".next" / "BUILD_ID").exists():
            return target
        return _build(target)


def _build(target: Path) -> Path:
    staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        app = _unpack(staging)
        _without_google_fonts(app)
        for name in FILES:
            shutil.copyfile(SOURCE / name, app / name)
        _run(["npm", "ci", "--no-audit", "--no-fund", "--fetch-retries=1", "--fetch-timeout=20000"],
             app, INSTALL_TIMEOUT * 2, "npm ci of agent-chat-ui's dependencies", skip=True)
        _run([str(app / "node_modules" / ".bin" / "next"), "build", "--no-lint"],
             app, BUILD_TIMEOUT, "next build of agent-chat-ui", skip=False)
        shutil.rmtree(app / ".next" / "cache")  # webpack's cache, 300 MB that next start does not read
        with contextlib.suppress(OSError):  # OSError: another process built it meanwhile
            app.rename(target)  # whole or not at all
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _raise(kind: type[Exception]) -> Callable[[str], NoReturn]:
    def outcome(message: str) -> NoReturn:
        raise kind(message)
    return outcome


if __name__ == "__main__":
    try:
        print(build())
    except (Unavailable, BuildFailed) as exc:  # the tests say it again, skipped or failed
        print(f"agent-chat-ui not built: {exc}", file=sys.stderr)
        sys.exit(1)
