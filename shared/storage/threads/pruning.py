"""Pruning a thread's checkpoints: which ones a conversation still needs, and deleting the rest.

Every step of every run is a checkpoint (``durability="sync"``), kept until the conversation is
deleted. Most of them are never read again, but not all can go: the messages are a DeltaChannel
(shared/storage/threads/state.py), so the state at a checkpoint is rebuilt from the task writes of its
ancestors back to the nearest one holding a full copy of the messages (a snapshot, every
``SNAPSHOT_FREQUENCY`` updates; a thread from before DeltaChannel holds one in every checkpoint),
or back to the root when none does. What is kept (:func:`keep`):

- **each branch's latest checkpoint** (each leaf of the tree, and the head the conversation's row
  names after a switch or a rollback), and every ancestor its state is rebuilt from: up to and
  including the nearest one holding a full copy;
- **every branch whole, from the first fork point down** (an edit or a regenerate: DESIGN.md
  "Branches"), and the fork point's own ancestors back to its full copy: the branch view lists the
  alternatives at each fork point and reads the state there, so every path from a branch's head
  to the fork points above it stays as it was.

The rest, the steps before the newest full copy of a thread's messages, is deleted with its
writes (and, on PostgreSQL, the blobs no remaining checkpoint names), one transaction per thread;
the oldest kept checkpoint becomes the thread's first (its parent link is cleared), so a walk up
the tree never meets a checkpoint that is gone. A thread with no full copy yet (fewer than
``SNAPSHOT_FREQUENCY`` message updates on its path) loses nothing.

The ledger (worker/tools/ledger/) names conversations, runs and messages, never checkpoints: it
needs nothing more. A run continuing from the head, or waiting at an interrupt there, needs the
head, its pending writes and what its state is rebuilt from, all kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeGuard

import aiosqlite
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from shared.compat import postgres_saver_connection

if TYPE_CHECKING:
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

#: the DeltaChannel whose full copies bound how far back a state is rebuilt (shared/storage/threads/state.py)
MESSAGES = "messages"
#: checkpoint ids per DELETE statement
CHUNK = 500


@dataclass(frozen=True, slots=True)
class Node:
    """A checkpoint of the thread, as pruning sees it."""

    id: str
    parent: str | None
    #: its stored values hold a full copy of the messages: its state needs no ancestor
    seeded: bool


@dataclass(frozen=True, slots=True)
class Plan:
    keep: frozenset[str]
    drop: tuple[str, ...]
    #: kept checkpoints whose parent is dropped: they become roots
    roots: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Pruned:
    kept: int
    deleted: int


def keep(nodes: Iterable[Node], head: str | None = None) -> Plan:
    """What to keep of a thread's checkpoints (the module's docstring says why each).

    ``head``: the branch head the conversation's row names, if any (it may be an inner checkpoint).
    """
    by_id = {n.id: n for n in nodes}
    children: dict[str, int] = {}
    for n in by_id.values():
        if n.parent is not None and n.parent in by_id:
            children[n.parent] = children.get(n.parent, 0) + 1
    forks = {node_id for node_id, count in children.items() if count > 1}

    below_fork: dict[str, bool] = {}

    def is_below_fork(node_id: str) -> bool:
        """Whether a fork point is a strict ancestor of the checkpoint (iteratively, memoised)."""
        path: list[str] = []
        node: str | None = node_id
        answer = False
        while node is not None and node in by_id:
            if node in below_fork:
                answer = below_fork[node]
                break
            path.append(node)
            parent = by_id[node].parent
            if parent is not None and parent in forks:
                answer = True
                break
            node = parent
        # Everything walked shares the answer: below the same fork, or below none.
        for walked in path:
            below_fork[walked] = answer
        return below_fork.get(node_id, answer)

    starts = [n for n in by_id if n not in children]
    if head is not None and head in by_id:
        starts.append(head)
    kept: set[str] = set()
    for start in starts:
        node: str | None = start
        while node is not None and node in by_id and node not in kept:
            kept.add(node)
            current = by_id[node]
            if current.seeded and not is_below_fork(node):
                break  # its state needs nothing above it, and no branch view walks past it
            node = current.parent
    drop = tuple(sorted(n for n in by_id if n not in kept))
    dropped = set(drop)
    roots = tuple(sorted(n for n in kept if by_id[n].parent in dropped))
    return Plan(frozenset(kept), drop, roots)


async def read_nodes(saver: BaseCheckpointSaver[Any], thread_id: str) -> list[Node]:
    """The thread's checkpoints (its root namespace: the agent has no subgraphs): ids, parents and
    whether each holds a full copy of the messages, read without rebuilding any state."""
    if isinstance(saver, AsyncSqliteSaver):
        async with saver.lock, saver.conn.execute(
            "SELECT checkpoint_id, parent_checkpoint_id, type, checkpoint FROM checkpoints"
            " WHERE thread_id = ? AND checkpoint_ns = ''", (thread_id,),
        ) as cursor:
            found = await cursor.fetchall()
        # The checkpoint holds its channel values (a DeltaChannel's only when it is a full copy).
        return [
            Node(str(c), str(p) if p else None, MESSAGES in saver.serde.loads_typed((t, b))["channel_values"])
            for c, p, t, b in found
        ]
    if _is_postgres(saver):
        async with postgres_saver_connection(saver.conn) as conn:
            rows = await (await conn.execute(_NODES_SQL, (MESSAGES, thread_id))).fetchall()
            return [Node(str(r["checkpoint_id"]), r["parent_checkpoint_id"], bool(r["seeded"])) for r in rows]
    raise TypeError(f"pruning knows no tables of {type(saver).__name__}")


#: PostgreSQL keeps channel values apart, one blob per channel version, ``empty`` where the version
#: has no value stored (a DeltaChannel's step between two full copies: the saver's ``_dump_blobs``)
_NODES_SQL = (
    "SELECT c.checkpoint_id, c.parent_checkpoint_id, EXISTS (SELECT 1 FROM checkpoint_blobs b"
    " WHERE b.thread_id = c.thread_id AND b.checkpoint_ns = c.checkpoint_ns AND b.channel = %s"
    " AND b.version = c.checkpoint -> 'channel_versions' ->> b.channel AND b.type <> 'empty') AS seeded"
    " FROM checkpoints c WHERE c.thread_id = %s AND c.checkpoint_ns = ''"
)


async def prune_thread(saver: BaseCheckpointSaver[Any], thread_id: str, head: str | None = None) -> Pruned:
    """Delete what the thread no longer needs (:func:`keep`); how many checkpoints stay and went."""
    plan = keep(await read_nodes(saver, thread_id), head)
    if plan.drop:
        if isinstance(saver, AsyncSqliteSaver):
            await _delete_sqlite(saver, thread_id, plan)
        elif _is_postgres(saver):
            await _delete_postgres(saver, thread_id, plan)
        else:
            raise TypeError(f"pruning knows no tables of {type(saver).__name__}")
    return Pruned(len(plan.keep), len(plan.drop))


def _is_postgres(saver: BaseCheckpointSaver[Any]) -> TypeGuard[AsyncPostgresSaver]:
    """Whether ``saver`` is PostgreSQL's, asked only of a saver that is not SQLite's: the PostgreSQL
    saver and psycopg (~7 MB) are imported then, never by a worker on SQLite (bench figure 16)."""
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    return isinstance(saver, AsyncPostgresSaver)


def _chunks(ids: Sequence[str]) -> list[Sequence[str]]:
    return [ids[i:i + CHUNK] for i in range(0, len(ids), CHUNK)]


async def _delete_sqlite(saver: AsyncSqliteSaver, thread_id: str, plan: Plan) -> None:
    # The saver's own connection and lock: the one writer of the file's checkpoint tables, so a
    # run's checkpoint write waits for this transaction instead of meeting "database is locked".
    async with saver.lock:
        conn: aiosqlite.Connection = saver.conn
        try:
            for chunk in _chunks(plan.drop):
                marks = ", ".join("?" * len(chunk))
                for table in ("writes", "checkpoints"):
                    await conn.execute(
                        f"DELETE FROM {table} WHERE thread_id = ? AND checkpoint_ns = ''"  # noqa: S608
                        f" AND checkpoint_id IN ({marks})", (thread_id, *chunk),
                    )
            await conn.executemany(
                "UPDATE checkpoints SET parent_checkpoint_id = NULL"
                " WHERE thread_id = ? AND checkpoint_ns = '' AND checkpoint_id = ?",
                [(thread_id, root) for root in plan.roots],
            )
            await conn.commit()
        except BaseException:
            await conn.rollback()
            raise


#: the thread's blobs that no checkpoint left names (a blob is one channel's value at one version)
_UNNAMED_BLOBS_SQL = (
    "DELETE FROM checkpoint_blobs b WHERE b.thread_id = %s AND b.checkpoint_ns = ''"
    " AND NOT EXISTS (SELECT 1 FROM checkpoints c WHERE c.thread_id = b.thread_id"
    " AND c.checkpoint_ns = b.checkpoint_ns AND c.checkpoint -> 'channel_versions' ->> b.channel = b.version)"
)


async def _delete_postgres(saver: AsyncPostgresSaver, thread_id: str, plan: Plan) -> None:
    # A run writing beside this commits its checkpoint and the blobs it names in one transaction:
    # a statement here sees both or neither, so no blob of a new checkpoint is taken for unnamed.
    async with postgres_saver_connection(saver.conn) as conn, conn.transaction():
        for chunk in _chunks(plan.drop):
            ids = list(chunk)
            for table in ("checkpoint_writes", "checkpoints"):
                await conn.execute(
                    f"DELETE FROM {table} WHERE thread_id = %s AND checkpoint_ns = ''"  # noqa: S608
                    " AND checkpoint_id = ANY(%s)", (thread_id, ids),
                )
        await conn.execute(
            "UPDATE checkpoints SET parent_checkpoint_id = NULL"
            " WHERE thread_id = %s AND checkpoint_ns = '' AND checkpoint_id = ANY(%s)",
            (thread_id, list(plan.roots)),
        )
        await conn.execute(_UNNAMED_BLOBS_SQL, (thread_id,))
