"""A full copy of the messages read from the writes instead of decoded (issue 44): real API,
worker and Redis, on SQLite and on PostgreSQL.

LangGraph stores a thread's whole message list every ``MESSAGES_SNAPSHOT_EVERY`` updates; the
JSON Lines export reads such a checkpoint as any other, its parent's messages after the writes
stored on the parent (shared/storage/threads/history.py ``_follows``), and the reader's
serializer decodes the copy only if read (shared/storage/threads/decoding.py). Here, on
conversations of every shape the export meets (tests/test_export_lines.py's: approvals, an edit
and a regenerate fork, a run stopped mid-answer; then pruned), every copy is compared with its
parent's messages after its parent's writes: each read so holds exactly that, was not decoded
by the walk, and some were read so; a copy that does not hold that (a fork's first) was read
whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.fakes.ollama import FakeOllama
from tests.support.env import SophosEnv
from tests.support.postgres import engine_overrides
from tests.support.redis_server import RedisServer
from tests.support.stacks import module_stack
from tests.test_export_lines import decided_and_forked, same_lines, stopped
from tests.test_pruning import prune


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_a_copy_read_from_the_writes_is_the_copy_stored(
    engine: str, request: pytest.FixtureRequest, tmp_path: Path, redis_server: RedisServer, model: FakeOllama,
) -> None:
    overrides = {"MESSAGES_SNAPSHOT_EVERY": "4", **engine_overrides(request, engine, short_lease=False)}
    with module_stack(tmp_path, redis_server.url, model, approval=["add"], **overrides) as stack:
        url = stack.env.api_url
        conversations = [decided_and_forked(url, model), stopped(url, model)]
        counts = [copies(stack.env, c) for c in conversations]
        assert prune(stack.env)["deleted"] > 0
        counts += [copies(stack.env, c) for c in conversations]
        for conversation in conversations:
            same_lines(stack.env, conversation)
    light = sum(c["light"] for c in counts)
    # Copies read from the writes, the others decoded (each thread's first read, a fork's first).
    assert light > 4 and sum(c["whole"] for c in counts) > 0, counts
    assert sum(c["differs"] for c in counts) > 0, counts  # a copy the writes do not make: the fork's


def copies(env: SophosEnv, conversation: str) -> dict[str, int]:
    """Every checkpoint of the thread holding a copy of the messages, read down the whole thread:
    compared with its parent's messages after its parent's writes. Returns how many were read
    from the writes (``light``), decoded (``whole``), and held other than that (``differs``)."""
    from shared.storage.threads.branch import thread_at
    from shared.storage.threads.history import MESSAGES, path
    from shared.storage.threads.snapshot import ThreadStates, _reduce
    from shared.storage.threads.source import ThreadSource

    if "DATABASE_URL" in env:
        source = ThreadSource("postgresql", env["DATABASE_URL"])
    else:
        source = ThreadSource("sqlite", f"{env.database_path.as_uri()}?mode=ro")

    def check(saver: Any) -> dict[str, int]:
        graph = ThreadStates(saver)
        # First the walk alone (nothing else decodes meanwhile), then each copy compared.
        walked: list[tuple[Any, bool, list[Any] | None]] = []
        decoded: set[int] = set()
        for read in path(graph, thread_at(conversation)):
            held = read.saved.checkpoint["channel_values"].get(MESSAGES)
            if held is None:
                continue
            # Decoded only if read whole (PostgreSQL gives the checkpoints after a copy whose step
            # wrote no message the same blob: decoded once, by the first read whole).
            if read.light:
                assert not held.decoded or id(held) in decoded, read.saved.config
            else:
                assert held.decoded, read.saved.config
                decoded.add(id(held))
            channel = list(read.channel.values()) if read.light and read.channel is not None else None
            walked.append((read.saved, read.light, channel))
        every = saver.list(thread_at(conversation))
        listed = {saved.config["configurable"]["checkpoint_id"]: saved for saved in every}
        found = {"light": 0, "whole": 0, "differs": 0}
        for saved, light, channel in walked:
            stored = list(saved.checkpoint["channel_values"][MESSAGES].value)
            parent = listed.get((saved.parent_config or {}).get("configurable", {}).get("checkpoint_id"))
            follows: bool | None = None
            if parent is not None:
                writes = [v for _, c, v in parent.pending_writes or () if c == MESSAGES]
                follows = _reduce(graph.channel_value(parent) or [], writes) == stored
                found["differs"] += not follows
            if light:
                found["light"] += 1
                assert follows and channel == stored, saved.config
            else:
                found["whole"] += 1
        return found

    return source.read(check)
