"""Which checkpoints pruning keeps (shared/storage/threads/pruning.py ``keep``), on trees written by hand.

Ids sort by time, as LangGraph's do. ``*`` marks a checkpoint holding a full copy of the messages.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from shared.storage.threads.pruning import Node, keep


def tree(*edges: str) -> list[Node]:
    """``"b<a"``: b's parent is a; ``"a"``: a root; a trailing ``*``: b holds a full copy."""
    nodes = []
    for edge in edges:
        child, _, parent = edge.partition("<")
        seeded = child.endswith("*")
        nodes.append(Node(child.rstrip("*"), parent or None, seeded))
    return nodes


def test_a_thread_without_a_full_copy_keeps_everything() -> None:
    plan = keep(tree("a", "b<a", "c<b", "d<c"))
    assert plan.drop == () and plan.roots == ()


def test_one_branch_keeps_its_head_back_to_the_newest_full_copy() -> None:
    plan = keep(tree("a", "b<a", "c*<b", "d<c", "e*<d", "f<e", "g<f"))
    assert plan.keep == {"e", "f", "g"}
    assert plan.drop == ("a", "b", "c", "d")
    assert plan.roots == ("e",)


def test_branches_are_kept_whole_from_the_first_fork_point_down() -> None:
    # c forks into d (the old branch) and x (an edit); both hold full copies further down.
    plan = keep(tree("a", "b*<a", "c<b", "d*<c", "e<d", "x<c", "y*<x", "z<y"))
    assert plan.keep == {"b", "c", "d", "e", "x", "y", "z"}
    assert plan.drop == ("a",)
    assert plan.roots == ("b",)


def test_a_fork_point_above_no_full_copy_keeps_everything() -> None:
    plan = keep(tree("a", "b<a", "c<b", "d*<c", "x<b"))
    assert plan.drop == ()


def test_the_head_the_row_names_keeps_its_own_ancestors() -> None:
    # A rollback to c: the row names c, an inner checkpoint; e is the newest.
    nodes = tree("a", "b*<a", "c<b", "d<c", "e*<d", "f<e")
    assert keep(nodes).keep == {"e", "f"}
    plan = keep(nodes, head="c")
    assert plan.keep == {"b", "c", "e", "f"}
    assert plan.drop == ("a", "d")
    assert set(plan.roots) == {"b", "e"}


def test_pruning_twice_drops_nothing_more() -> None:
    nodes = tree("a", "b<a", "c*<b", "d<c", "e<d")
    plan = keep(nodes)
    left = [n if n.id not in plan.roots else Node(n.id, None, n.seeded) for n in nodes if n.id in plan.keep]
    again = keep(left)
    assert again.drop == () and again.keep == plan.keep


def test_a_parent_outside_the_listing_ends_the_walk() -> None:
    plan = keep([Node("c", "gone", False), Node("d", "c", False)])
    assert plan.keep == {"c", "d"} and plan.drop == ()


async def test_a_run_from_a_checkpoint_that_is_gone_is_refused_not_started_empty() -> None:
    from langchain_core.messages import HumanMessage
    from langgraph.checkpoint.memory import InMemorySaver

    from shared.contracts.jobs import JobKind, RunJob
    from shared.storage.threads.branch import thread_at
    from shared.storage.threads.state import reader_graph
    from worker.run.inputs import NotResumable, graph_input

    graph = reader_graph(InMemorySaver())
    job = RunJob("run-1", "conversation-1", JobKind.RUN, "again", 1.0, checkpoint_id="pruned-checkpoint")
    with pytest.raises(NotResumable, match="no longer exists"):
        await graph_input(graph, job, HumanMessage("again"), thread_at("conversation-1", "pruned-checkpoint"))


def test_a_worker_on_sqlite_loads_no_postgresql_saver() -> None:
    """The worker's modules, as its process imports them (worker/__main__.py, then worker.jobs):
    pruning imports PostgreSQL's saver and psycopg (~7 MB a process: bench figure 16) only for a
    saver that is not SQLite's."""
    code = "import sys, worker.__main__, worker.jobs; print(sorted(sys.modules))"
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        cwd=Path(__file__).resolve().parents[2],
    ).stdout
    found = [m for m in eval(loaded) if m.startswith(("psycopg", "langgraph.checkpoint.postgres"))]  # noqa: S307
    assert "worker.upkeep.pruning" in loaded and not found, found
