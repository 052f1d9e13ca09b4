"""``sophos prune``: start the worker's checkpoint pruning, and follow it to its end."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from sophos_cli.client import Api

#: seconds between two looks at the prune's progress
POLL_SECONDS = 0.5


def summary(progress: dict[str, Any]) -> str:
    return (f"{progress['conversations']} conversations, {progress['deleted']} checkpoints deleted, "
            f"{progress['kept']} kept, {progress['skipped']} skipped (a run queued, running or waiting)")


def prune(api: Api, args: argparse.Namespace) -> int:
    progress = api.prune()
    job = str(progress["job"])
    if args.no_wait:
        print(f"pruning: {job} (sophos prune's progress: GET /api/checkpoints/prune/{job})")
        return 0
    deadline = time.monotonic() + args.timeout
    while progress["state"] == "running":
        if time.monotonic() > deadline:
            print(f"{job}: still running after {args.timeout:.0f}s: {summary(progress)}", file=sys.stderr)
            return 1
        time.sleep(POLL_SECONDS)
        progress = api.prune_progress(job)
    if progress["state"] != "done":
        print(f"{job}: {progress['state']}", file=sys.stderr)
        return 1
    print(f"pruned: {summary(progress)}")
    return 0
