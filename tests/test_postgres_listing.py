"""The PostgreSQL listing of our own lists what LangGraph's saver lists (shared/storage/threads/listing.py).

The machine's PostgreSQL, no process: threads of a graph with the agent's state (messages a
``DeltaChannel``, a full copy every 8 updates) long enough to hold several copies, with tool
calls, a message replaced under its id, a fork and an ``update_state``. Listed whole, a page at a
time, by run, across threads, each tuple is the saver's (a copy's value once read), no copy was
fetched by the listing, and a copy shared by checkpoints is one object, fetched once.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.postgres import PostgresSaver
from psycopg.rows import dict_row

from shared.compat import DeltaSnapshot
from shared.errors import DatabaseUnavailable
from shared.storage.threads.branch import thread_at
from shared.storage.threads.decoding import DecodedOnce
from shared.storage.threads.listing import LazyPostgresSaver
from tests.test_history_walk import graph_on, question

THREADS = ("thread-1", "thread-2")
TURNS = 24


@pytest.fixture(scope="module")
def url(postgres_server: Any) -> str:
    """A database holding :data:`THREADS`, the first forked and updated."""
    url: str = postgres_server.create_database()
    with _connect(url) as conn:
        saver = PostgresSaver(conn)
        saver.setup()
        graph = graph_on(saver)
        for thread in THREADS:
            config = thread_at(thread)
            for turn in range(TURNS):
                run = {"run_id": f"{thread}-{turn}"}
                asked = {"messages": [HumanMessage(content=question(turn))]}
                graph.invoke(asked, {**config, "metadata": run}, durability="sync")
        config = thread_at(THREADS[0])
        fork_at = next(s for s in reversed(list(graph.get_state_history(config))) if s.metadata["step"] == 20)
        graph.invoke({"messages": [HumanMessage(content="another way")]}, fork_at.config, durability="sync")
        graph.update_state(config, {"messages": [AIMessage(content="said by update_state")]})
    return url


def _connect(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True, prepare_threshold=0, row_factory=dict_row)


@pytest.fixture
def conn(url: str) -> Iterator[psycopg.Connection[Any]]:
    with _connect(url) as conn:
        yield conn


def comparable(saved: Any) -> tuple[Any, ...]:
    values = {
        channel: ("copy", value.value) if isinstance(value, DeltaSnapshot) else value
        for channel, value in saved.checkpoint["channel_values"].items()
    }
    checkpoint = {**saved.checkpoint, "channel_values": values}
    return saved.config, checkpoint, saved.metadata, saved.parent_config, saved.pending_writes


LISTINGS: list[tuple[dict[str, Any] | None, dict[str, Any]]] = [
    (thread_at(THREADS[0]), {}),
    (thread_at(THREADS[1]), {}),
    (thread_at(THREADS[0]), {"limit": 7}),
    (thread_at(THREADS[0]), {"filter": {"run_id": f"{THREADS[0]}-5"}}),
    (None, {"filter": {"source": "update"}}),
    (None, {}),
]


@pytest.mark.parametrize("serde", [DecodedOnce, None], ids=["reader's serializer", "saver's own"])
@pytest.mark.parametrize(("config", "options"), LISTINGS)
def test_the_listing_is_the_savers(
    conn: psycopg.Connection[Any], serde: Any, config: dict[str, Any] | None, options: dict[str, Any]
) -> None:
    def saver(kind: type[PostgresSaver]) -> PostgresSaver:
        return kind(conn, serde=serde()) if serde is not None else kind(conn)

    theirs = list(saver(PostgresSaver).list(config, **options))
    ours_saver = saver(LazyPostgresSaver)
    ours = list(ours_saver.list(config, **options))
    assert isinstance(ours_saver, LazyPostgresSaver) and ours_saver.fetched == 0
    held = [v for s in ours for v in s.checkpoint["channel_values"].values() if isinstance(v, DeltaSnapshot)]
    copies = {id(v) for v in held}
    assert theirs and [comparable(s) for s in ours] == [comparable(s) for s in theirs]
    assert ours_saver.fetched == len(copies)
    if config is not None and not options:
        assert len(theirs) > 60 and len(copies) >= 4
        # A copy shared by checkpoints (a step that wrote no message) is one object.
        assert len(held) > len(copies)


def test_the_listing_a_page_at_a_time_is_the_savers(conn: psycopg.Connection[Any]) -> None:
    config = thread_at(THREADS[0])
    ours, theirs = LazyPostgresSaver(conn, serde=DecodedOnce()), PostgresSaver(conn, serde=DecodedOnce())
    before: dict[str, Any] | None = None
    pages = 0
    while True:
        page = list(ours.list(config, before=before, limit=9))
        expected = theirs.list(config, before=before, limit=9)
        assert [comparable(s) for s in page] == [comparable(s) for s in expected]
        pages += 1
        if len(page) < 9:
            break
        before = page[-1].config
    assert pages > 5


def test_a_checkpoint_of_an_older_format_is_listed_by_the_saver(conn: psycopg.Connection[Any]) -> None:
    """Before format 4 a checkpoint's Sends were its parent's writes: the saver's own listing
    moves them (``_migrate_pending_sends``), so a listing holding one is the saver's."""
    config = thread_at(THREADS[1])
    newest = next(PostgresSaver(conn).list(config, limit=1)).config["configurable"]["checkpoint_id"]
    with conn.transaction():
        sql = "UPDATE checkpoints SET checkpoint = jsonb_set(checkpoint, '{v}', %s) WHERE checkpoint_id = %s"
        conn.execute(sql, ("3", newest))
        saver = LazyPostgresSaver(conn)
        ours = []
        for saved in saver.list(config, limit=3):
            # Given with the saver's lock free: a copy listed before may be read meanwhile.
            assert not saver.lock.locked()
            ours.append(saved)
        expected = PostgresSaver(conn).list(config, limit=3)
        assert [comparable(s) for s in ours] == [comparable(s) for s in expected]
        assert ours[0].checkpoint["v"] == 3
        raise psycopg.Rollback


def test_a_copy_gone_when_read_is_told(conn: psycopg.Connection[Any]) -> None:
    """A copy deleted after it was listed (the thread pruned meanwhile) fails the read as stale,
    DATABASE_UNAVAILABLE, rather than read as missing."""
    saver = LazyPostgresSaver(conn, serde=DecodedOnce())
    listed = list(saver.list(thread_at(THREADS[1])))
    values = (v for s in listed for v in s.checkpoint["channel_values"].values())
    copy = next(v for v in values if isinstance(v, DeltaSnapshot))
    with conn.transaction():
        sql = "DELETE FROM checkpoint_blobs WHERE thread_id = %s AND channel = 'messages'"
        conn.execute(sql, (THREADS[1],))
        with pytest.raises(DatabaseUnavailable, match="changed while it was read"):
            _ = copy.value
        raise psycopg.Rollback


def test_the_benchs_side_by_side_lists_the_same_checkpoints_each_way(
    postgres_server: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python -m bench.listing`` on PostgreSQL (bench/RESULTS.md, figure 24's reading): the
    reader's listing and the saver's list the same checkpoints, and the export's lines read on
    each are the same bytes (it fails otherwise)."""
    from bench import listing

    [counts] = listing.postgresql(postgres_server.create_database(), lengths=(6,))
    assert len(counts) == 3 and len(set(counts.values())) == 1 and next(iter(counts.values())) > 6
    assert "export lines" in capsys.readouterr().out
