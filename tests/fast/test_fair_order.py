"""The worker's fair order of due jobs (worker/queue/fair.py): round-robin across owners, the owner
served least recently first, jobs that are not runs never held back."""

from __future__ import annotations

from worker.queue.fair import round_robin


def _ids(*names: str) -> list[bytes]:
    return [n.encode() for n in names]


def test_each_owner_gets_one_turn_per_round_however_many_they_queued() -> None:
    queue = _ids(*(f"a{i}" for i in range(50)), "b0", "c0")
    owners = [("alice", 0)] * 50 + [("bob", 0), ("carol", 0)]
    order = round_robin(queue, owners)
    assert order[:4] == _ids("a0", "b0", "c0", "a1")
    assert order[4:] == _ids(*(f"a{i}" for i in range(2, 50)))


def test_within_a_round_the_owner_served_least_recently_goes_first() -> None:
    # alice's run was taken a moment ago; bob and carol queued after her next ones but were
    # never served: they go first, so bob waits behind none of alice's fifty.
    queue = _ids("a1", "a2", "a3", "b0", "c0")
    owners = [("alice", 1_000)] * 3 + [("bob", 0), ("carol", 0)]
    assert round_robin(queue, owners) == _ids("b0", "c0", "a1", "a2", "a3")
    # carol was served before bob: bob first among those who wait.
    owners = [("alice", 1_000)] * 3 + [("bob", 900), ("carol", 500)]
    assert round_robin(queue, owners) == _ids("c0", "b0", "a1", "a2", "a3")


def test_jobs_that_are_not_runs_are_owners_of_their_own() -> None:
    queue = _ids("a0", "a1", "webhook", "delete")
    owners = [("alice", 0), ("alice", 0), ("", 0), ("", 0)]
    assert round_robin(queue, owners) == _ids("a0", "webhook", "delete", "a1")


def test_queue_order_is_kept_for_one_owner() -> None:
    queue = _ids("x", "y", "z")
    assert round_robin(queue, [("alice", 7)] * 3) == queue
