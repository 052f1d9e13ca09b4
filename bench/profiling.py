"""``--profile``: py-spy attached to the worker, the API and the floor while they run the workload.

py-spy (``pip install py-spy``) samples a live process from outside; the
profile phase runs after every figure is measured, so its overhead touches none.
Output: one collapsed-stack file per process (``py-spy record --format raw``),
open it with any flame-graph viewer, and a summary of where the samples fall.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

#: Frames that are ours; the summary lists the heaviest of these and of libraries.
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^:()]+)(?::\d+)?\)$")


def py_spy() -> str | None:
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


class Recorder:
    """``py-spy record`` on one pid until :meth:`stop`."""

    def __init__(self, pid: int, out: Path, *, rate: int = 500) -> None:
        exe = py_spy()
        if exe is None:
            raise RuntimeError("--profile needs py-spy: .venv/bin/pip install py-spy")
        self.out = out
        self.log = out.with_suffix(".log")
        with open(self.log, "wb") as log:
            self.popen = subprocess.Popen(
                [
                    exe,
                    "record",
                    "--pid",
                    str(pid),
                    "--rate",
                    str(rate),
                    "--format",
                    "raw",
                    "--output",
                    str(out),
                    "--gil",
                    "--nonblocking",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def stop(self) -> Path:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGINT)
            try:
                self.popen.wait(30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        return self.out


@dataclass(frozen=True, slots=True)
class Hot:
    name: str
    inclusive: float  # share of samples with this frame on the stack
    own: float  # share of samples with this frame on top


def _frame_name(frame: str, root: str) -> str:
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    path = m.group("file")
    if path.startswith(root):
        path = path[len(root) :].lstrip("/")
    else:
        marker = "site-packages/"
        path = path.split(marker, 1)[1] if marker in path else os.path.basename(path)
    return f"{m.group('func')} ({path})"


#: Frames every sample passes through (interpreter start, event loop, threads): not worth a row.
_SCAFFOLDING = (
    "runpy>",
    "runners.py)",
    "(__main__.py)",
    "BaseEventLoop.run_",
    "BaseEventLoop._run_once",
    "Handle._run (events.py)",
    "Server.run (server.py)",
    "asyncio_run (_compat.py)",
    "Thread._bootstrap",
    "Thread.run (threading.py)",
)


def summarize(raw: Path, *, top: int = 30) -> tuple[int, list[Hot]]:
    """(samples, heaviest frames by inclusive share) of a ``--format raw`` file."""
    root = str(Path(__file__).resolve().parent.parent)
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    if not raw.exists():
        return 0, []
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [_frame_name(f, root) for f in stack.split(";") if f]
        # py-spy puts the thread name first when it has one; drop the non-frames
        frames = [f for f in frames if "(" in f]
        for name in set(frames):
            inclusive[name] += count
        if frames:
            own[frames[-1]] += count
    ranked = [(name, n) for name, n in inclusive.most_common() if not any(x in name for x in _SCAFFOLDING)]
    hot = [Hot(name, n / total, own[name] / total) for name, n in ranked[:top]] if total else []
    return total, hot


def render(title: str, raw: Path, *, top: int = 30) -> str:
    total, hot = summarize(raw, top=top)
    lines = [
        f"### {title}",
        "",
        f"{total} samples taken while the process held the GIL (`{raw.name}`, py-spy `--gil`); the share "
        "of them with the frame on the stack, and on top (interpreter and event-loop frames left out):",
        "",
        "| frame | on stack | on top |",
        "|---|---:|---:|",
    ]
    lines += [f"| `{h.name}` | {h.inclusive:.0%} | {h.own:.0%} |" for h in hot]
    return "\n".join(lines) + "\n"
