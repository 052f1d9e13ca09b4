"""How the figures are run: one after another (the full mode), or a few at once (the smoke mode).

The full mode measures each figure alone, so that no figure's load falls on another's times. The
smoke mode only checks that each figure can be measured, and most of a figure's time there is
waiting (on a process starting, a sweep's next pass, a slow fake model), so it runs up to
``lanes`` figures at once, each in a thread of its own with its own stacks and event loop. What a
figure counts in this process (figure 18's thread hops, figure 22's floor) then counts the other
figures' work too, and its times are the shared machine's: the smoke mode reads neither.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import TypeVar

T = TypeVar("T")


def run_all(jobs: Sequence[Callable[[], T]], *, lanes: int = 1, first: Sequence[int] = ()) -> list[T]:
    """Each job's result, in the jobs' order. ``lanes`` 1: one job after another, in that order;
    more: up to that many at once, the jobs at the indices ``first`` started first (in that order),
    then the others in theirs. A job that raises stops those not yet started; its exception (the
    first in the jobs' order) is raised once those running are done."""
    if lanes <= 1:
        return [job() for job in jobs]
    futures: dict[int, Future[T]] = {}
    with ThreadPoolExecutor(max_workers=lanes, thread_name_prefix="figure") as pool:
        for i in [*first, *(i for i in range(len(jobs)) if i not in first)]:
            futures[i] = pool.submit(jobs[i])
        wait(futures.values(), return_when=FIRST_EXCEPTION)
        for future in futures.values():
            future.cancel()  # only those not started: the running ones end on their own
    in_order = [futures[i] for i in range(len(jobs))]
    for future in in_order:
        if not future.cancelled() and (error := future.exception()) is not None:
            raise error
    return [future.result() for future in in_order]
