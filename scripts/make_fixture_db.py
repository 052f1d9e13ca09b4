"""Make tests/fixtures/pre-delta.db: a database as the version before DeltaChannel wrote it.

Produced by the code of commit 3f6506e (branch ``delta``'s base: ``messages`` a
plain ``add_messages`` channel, every checkpoint holding the whole list), with
the real worker and API processes against the fake model of tests/fakes, exactly
as the tests run them. It holds three conversations (titles are their first
messages):

- ``fixture: two turns``: two runs, plain answers.
- ``fixture: with a tool``: one run with a tool call (``tools__add``) and its result.
- ``fixture: interrupted``: the worker was killed (SOPHOS_FAULT_KILL_AFTER_CHECKPOINT=3)
  right after the model asked for a tool; the next worker marked the run
  ``interrupted``. The thread has a pending ``tools`` task: it is resumable.

tests/test_storage.py opens a copy of it with the current code. Run it again only
to rebuild the fixture with the *old* code (``git checkout 3f6506e``), never with
the new one, or it no longer tests what it is for::

    .venv/bin/python scripts/make_fixture_db.py tests/fixtures/pre-delta.db
"""

from __future__ import annotations

import argparse
import signal
import sqlite3
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fakes.ollama import FakeOllama, Text, ToolCalls
from tests.support.client import get_json, post_chat, read_sse
from tests.support.env import make_sophos_env
from tests.support.ports import free_port
from tests.support.procs import ProcessGroup
from tests.support.redis_server import RedisServer

TWO_TURNS = "fixture: two turns"
WITH_A_TOOL = "fixture: with a tool"
INTERRUPTED = "fixture: interrupted"


def _chat(api_url: str, message: str, conversation: str | None = None) -> tuple[str, str]:
    response = post_chat(api_url, message, conversation)
    assert response.status_code == 202, response.text
    return response.json()["conversation"], response.json()["run"]


def _finished(api_url: str, conversation: str) -> None:
    events = read_sse(api_url, conversation, timeout=30)
    assert events[-1].event == "end" and events[-1].data["status"] == "completed", events


def make(target: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="sophos-fixture-") as tmp, FakeOllama(["test-model"]) as model:
        root = Path(tmp)
        redis = RedisServer(root / "redis").start()
        group = ProcessGroup(log_dir=root / "logs", cwd=root)
        try:
            env = make_sophos_env(root, redis_url=redis.url, ollama_url=model.url, api_port=free_port())
            worker = group.start_worker(env)
            api = group.start_api(env)
            url = api.url
            assert url is not None

            model.script(Text("First answer."), Text("Second answer."))
            conversation, _ = _chat(url, TWO_TURNS)
            _finished(url, conversation)
            _chat(url, "and a second turn", conversation)
            _finished(url, conversation)

            model.script(ToolCalls([("tools__add", {"a": 2, "b": 3})]), Text("The sum is 5."))
            conversation, _ = _chat(url, WITH_A_TOOL)
            _finished(url, conversation)
            assert worker.stop() == 0

            # Checkpoints of this run: input (1), after START (2), after the agent asked
            # for the tool (3): killed there, the tools task is pending.
            model.script(ToolCalls([("tools__add", {"a": 20, "b": 22})]), Text("The sum is 42."))
            doomed = group.start_worker(env.with_(SOPHOS_FAULT_KILL_AFTER_CHECKPOINT=3))
            conversation, run = _chat(url, INTERRUPTED)
            assert doomed.wait(30) == -signal.SIGKILL
            worker = group.start_worker(env)
            assert get_json(url, f"/api/runs/{run}")["status"] == "interrupted"
            assert get_json(url, f"/api/conversations/{conversation}")["resumable"] is True
            assert worker.stop() == 0
            api.stop()

            target.parent.mkdir(parents=True, exist_ok=True)
            target.unlink(missing_ok=True)
            conn = sqlite3.connect(env.database_path)
            try:
                # One self-contained file (no -wal), as small as it gets; user_version is kept.
                conn.execute("VACUUM INTO ?", (str(target),))
            finally:
                conn.close()
        finally:
            group.close()
            redis.stop()
    print(f"wrote {target} ({target.stat().st_size} bytes)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", type=Path, nargs="?", default=Path("tests/fixtures/pre-delta.db"))
    make(parser.parse_args().target)


if __name__ == "__main__":
    main()
